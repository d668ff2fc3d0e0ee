#!/usr/bin/env bash
# What keeping an event no subscription wants costs: a release Director on fresh databases of
# the local MariaDB (root, no password), then `spindle publish --ndjson` of N events (200 bytes
# of payload, BATCH per request) nobody subscribes to, against the same events each making one
# job (a disabled subscription, so nothing is delivered), two rounds alternated.
#
#   scripts/bench/kept-events.sh                     # N=20000 BATCH=100
#   N=50000 SPINDLE=target/release/spindle scripts/bench/kept-events.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
spindle="${SPINDLE:-$here/../../target/release/spindle}"
n="${N:-20000}"
batch="${BATCH:-100}"
tag="kept$$"
work="$(mktemp -d)"
port=$((18000 + RANDOM % 1000))
mysql -uroot -e "CREATE DATABASE ${tag}_j; CREATE DATABASE ${tag}_c"
"$spindle" director --listen "127.0.0.1:$port" --jobdb "mysql://root@127.0.0.1:3306/${tag}_j" \
  --control-db "mysql://root@127.0.0.1:3306/${tag}_c" --allow-subnet 127.0.0.0/8 \
  >"$work/director.log" 2>&1 &
director=$!
trap 'kill $director; mysql -uroot -e "DROP DATABASE ${tag}_j; DROP DATABASE ${tag}_c"; rm -rf "$work"' EXIT
api="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -sf "$api/readyz" >/dev/null && break; sleep 0.2; done
python3 - "$n" >"$work/none.ndjson" <<'PY'
import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"bucket": "nobody", "event_type": "x.y", "payload": {"n": i, "pad": "p" * 200}}))
PY
sed 's/"nobody"/"shop"/' "$work/none.ndjson" >"$work/one.ndjson"
"$spindle" subscriptions add --api "$api" --bucket shop --url http://127.0.0.1:9/x \
  --event-type x.y --disabled >/dev/null
sleep 2
for round in 1 2; do
  for kind in none one; do
    start=$(date +%s.%N)
    "$spindle" publish --api "$api" --ndjson "$work/$kind.ndjson" --batch "$batch" >/dev/null
    end=$(date +%s.%N)
    echo "$kind (round $round): $n events in $(echo "$end - $start" | bc) s, $(echo "$n / ($end - $start)" | bc) events/s"
  done
done
mysql -uroot -e "SELECT COUNT(*) AS events, SUM(payload IS NOT NULL) AS kept, \
  SUM(LENGTH(payload)) AS kept_bytes FROM ${tag}_j.events"
