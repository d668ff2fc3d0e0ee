#!/usr/bin/env bash
# The production path driven from outside: `spindle bench` stands up the topology (router,
# Redis dedup, Directors, fresh JobDBs) and measures every process's CPU, while wrk (Debian's
# package) submits jobs with scripts/bench/submit.lua for WRK_SECONDS instead of the bench's
# producers. The jobs the JobDBs accepted are measured until every one is delivered.
#
#   scripts/bench/wrk.sh --via-router                          # unordered, through a router
#   scripts/bench/wrk.sh --via-router --ordering-keys 10000    # ordered
#   scripts/bench/wrk.sh                                       # straight to one Director
#   WRK_SECONDS=10 WRK_THREADS=2 WRK_CONNECTIONS=16 SPINDLE=target/release/spindle scripts/bench/wrk.sh ...
#
# Every argument goes to `spindle bench` (`--jobs` is not used: wrk sends for WRK_SECONDS).
# The report adds `generator` (wrk's CPU) to the CPU per process; wrk's summary comes first.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
spindle="${SPINDLE:-$here/../../target/release/spindle}"
seconds="${WRK_SECONDS:-10}"
threads="${WRK_THREADS:-2}"
connections="${WRK_CONNECTIONS:-16}"
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install wrk" >&2; exit 2; }
exec "$spindle" bench "$@" --concurrency "$connections" --generator \
  "exec wrk -t$threads -c$connections -d${seconds}s --timeout 60s -s '$here/submit.lua' \"\$SPINDLE_BENCH_TARGET\" -- $threads"
