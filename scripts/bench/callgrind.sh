#!/usr/bin/env bash
# `spindle` for `spindle bench --bin`, with each router under callgrind: instructions per routed
# job, which unlike CPU time do not drift with the machine's speed between runs.
#
#   B=target/release/spindle
#   $B bench --via-router --jobs 20000 --bin scripts/bench/callgrind.sh
#   $B bench --via-router --jobs 40000 --bin scripts/bench/callgrind.sh
#   callgrind_annotate /tmp/spindle-callgrind/router.* | grep 'PROGRAM TOTALS'
#
# The router's instructions per job are the difference of the two totals over 20,000 (the
# start-up cancels). SPINDLE names the binary run (default: target/release/spindle beside this
# script); CALLGRIND_OUT the directory of the profiles (default /tmp/spindle-callgrind).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
spindle="${SPINDLE:-$here/../../target/release/spindle}"
if [ "${1:-}" = router ]; then
  out="${CALLGRIND_OUT:-/tmp/spindle-callgrind}"
  mkdir -p "$out"
  exec valgrind --tool=callgrind --callgrind-out-file="$out/router.%p" "$spindle" "$@"
fi
exec "$spindle" "$@"
