#!/usr/bin/env bash
# Delivery latency at fixed offered load: `spindle bench --latency` straight to one Director and
# through a router (Redis dedup, one Director). Each run first measures its capacity (closed
# loop, delivered jobs/s), then offers 25%, 50%, 75% and 90% of it in open loops of SECS each
# and reports submit → accepted, → first attempt and → succeeded p50 / p99 / p99.9 in ms. The
# Markdown table at the end is the one in docs/benchmarks.md.
#
#   scripts/bench/latency.sh                               # JOBS=50000 BATCH=10 SECS=20
#   JOBS=20000 SECS=10 SPINDLE=target/release/spindle scripts/bench/latency.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
spindle="${SPINDLE:-$here/../../target/release/spindle}"
jobs="${JOBS:-50000}"
batch="${BATCH:-10}"
secs="${SECS:-20}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for path in direct router; do
  extra=()
  if [ "$path" = router ]; then extra=(--via-router); fi
  "$spindle" bench --latency --jobs "$jobs" --batch "$batch" --rate-secs "$secs" "${extra[@]}" \
    | tee "$work/$path.txt"
done
python3 - "$work" <<'PY'
import json, sys
print("| path | load | offered jobs/s | late sends | accepted p50 / p99 / p99.9 | first attempt | succeeded |")
print("|---|---|---|---|---|---|---|")
for path in ("direct", "router"):
    for line in open(f"{sys.argv[1]}/{path}.txt"):
        if not line.startswith('{"') or '"latency"' not in line:
            continue
        run = json.loads(line)
        for p in run["latency"]:
            cell = lambda q: "-" if q is None else f'{q["p50_ms"]:.1f} / {q["p99_ms"]:.1f} / {q["p999_ms"]:.1f}'
            print(f'| {path} (capacity {run["capacity_per_sec"]:,.0f}/s) | {p["load"]*100:.0f}% '
                  f'| {p["offered_per_sec"]:,.0f} | {p["late_sends"]} | {cell(p["accepted"])} '
                  f'| {cell(p["first_attempt"])} | {cell(p["succeeded"])} |')
PY
