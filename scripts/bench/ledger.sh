#!/usr/bin/env bash
# The ledger's cost beside a full-rate bench (docs/benchmarks.md): `spindle bench --jobs N`
# alone, then again with `spindle audit --every-secs S` over its JobDB, alternated PAIRS
# times. Prints each bench's last report line, the audit's own CPU and its round times.
#   SPINDLE=target/release/spindle JOBS=600000 EVERY=10 PAIRS=1 scripts/bench/ledger.sh
set -euo pipefail
B=${SPINDLE:-target/release/spindle}
JOBS=${JOBS:-600000}
EVERY=${EVERY:-10}
PAIRS=${PAIRS:-1}
OUT=${OUT:-$(mktemp -d)}
sql() { mysql -uroot -h127.0.0.1 -N -e "$1"; }
report() { grep -E '^(delivered|cpu ms)' "$1" | tr '\n' ' '; echo; }

for pair in $(seq 1 "$PAIRS"); do
  $B bench --jobs "$JOBS" > "$OUT/alone-$pair.txt" 2>&1
  echo "alone:  $(report "$OUT/alone-$pair.txt")"

  before=$(sql "SHOW DATABASES LIKE 'spindle_bench%'" | sort)
  $B bench --jobs "$JOBS" > "$OUT/audited-$pair.txt" 2>&1 &
  bench=$!
  db=""
  while [ -z "$db" ] && kill -0 "$bench" 2>/dev/null; do
    sleep 0.5
    db=$(comm -13 <(echo "$before") <(sql "SHOW DATABASES LIKE 'spindle_bench%'" | sort) | head -1)
  done
  $B audit --jobdb "mysql://root@127.0.0.1:3306/$db" --every-secs "$EVERY" \
    --listen 127.0.0.1:0 > /dev/null 2> "$OUT/audit-$pair.txt" &
  audit=$!
  wait "$bench" || true
  cpu=$(awk '{print ($14 + $15) / 100}' "/proc/$audit/stat" 2>/dev/null || echo "?")
  kill "$audit" 2>/dev/null || true
  wait "$audit" 2>/dev/null || true
  echo "beside: $(report "$OUT/audited-$pair.txt")"
  echo "audit:  ${cpu} s of CPU; rounds (ms): $(grep -o 'in [0-9]* ms' "$OUT/audit-$pair.txt" \
    | awk '{print $2}' | tr '\n' ' ')"
done
echo "reports in $OUT"
