#!/usr/bin/env bash
# Regenerates what the SDKs take from spindle's OpenAPI document: sdks/openapi.json (the
# router's document, what producers call), the Python client (python/spindle_api/, by
# openapi-python-client) and the TypeScript types (typescript/src/schema.d.ts, by
# openapi-typescript). With an argument, writes into that directory instead (a copy of
# sdks/, to compare: `tests/sdks.rs` fails on any difference).
#
# Needs: a spindle binary ($SPINDLE, default target/debug/spindle), openapi-python-client
# 0.29.1 (pip) and the TypeScript package's dev dependencies (npm ci in sdks/typescript).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(cd "${1:-$here}" && pwd)"
spindle="${SPINDLE:-$here/../target/debug/spindle}"

command -v openapi-python-client > /dev/null \
  || { echo "openapi-python-client is missing: pip install openapi-python-client==0.29.1" >&2; exit 1; }
[ -x "$here/typescript/node_modules/.bin/openapi-typescript" ] \
  || { echo "openapi-typescript is missing: (cd sdks/typescript && npm ci)" >&2; exit 1; }
"$spindle" openapi > "$out/openapi.json"
rm -rf "$out/python/spindle_api"
mkdir -p "$out/python" "$out/typescript/src"
openapi-python-client generate --path "$out/openapi.json" --config "$here/python/generator.yml" \
  --meta none --output-path "$out/python/spindle_api" > /dev/null
"$here/typescript/node_modules/.bin/openapi-typescript" "$out/openapi.json" \
  -o "$out/typescript/src/schema.d.ts" > /dev/null 2>&1
