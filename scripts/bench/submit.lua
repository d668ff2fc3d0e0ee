-- wrk script: submit `spindle bench`'s jobs from outside (see scripts/bench/wrk.sh).
--
-- Run by `spindle bench --generator`, which sets SPINDLE_BENCH_* (src/cli/bench/generator.rs)
-- and measures what the JobDBs accepted. The jobs are the bench's own: requests of
-- SPINDLE_BENCH_BATCH jobs of 1 KB, round-robin over the buckets, keyed `$TAG-<n>` through a
-- router, with ordering keys `key-<n / buckets mod keys>` when asked. wrk sends for as long as its
-- `-d` says (it always runs that long); thread t of T sends requests t, t + T, t + 2T, ...
-- Usage: wrk -t<T> -c<connections> -d<seconds>s -s submit.lua "$SPINDLE_BENCH_TARGET" -- <T>

local function env(name, default)
  local v = os.getenv(name)
  if v == nil or v == "" then return default end
  return v
end

local batch = tonumber(env("SPINDLE_BENCH_BATCH", "100"))
local payload_bytes = tonumber(env("SPINDLE_BENCH_PAYLOAD_BYTES", "1024"))
local keys = tonumber(env("SPINDLE_BENCH_ORDERING_KEYS", "0"))
local buckets = tonumber(env("SPINDLE_BENCH_BUCKETS", "8"))
local keyed = env("SPINDLE_BENCH_KEYED", "0") == "1"
local tag = env("SPINDLE_BENCH_TAG", "wrk")
local first_job = tonumber(env("SPINDLE_BENCH_FIRST", "0"))
local endpoint = env("SPINDLE_BENCH_ENDPOINT", "http://127.0.0.1:1/ok")
local payload = string.rep("x", math.max(0, payload_bytes - 12))
local headers = { ["Content-Type"] = "application/json" }

-- Main state: number the threads and keep them, to add up their counts at the end.
local threads = {}
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

-- Thread state.
local step, next_req, statuses, verifying
function init(args)
  step = tonumber(args[1] or "1")
  next_req = id
  statuses = {}
  -- wrk calls the first thread's request() once after init to look at the request, and
  -- never sends it: that call must not take a batch.
  verifying = id == 0
end

function request()
  if verifying then
    verifying = false
    return wrk.format("GET", "/readyz")
  end
  local first = first_job + next_req * batch
  next_req = next_req + step
  local parts = {}
  for k = first, first + batch - 1 do
    local job = '{"bucket":"bench-' .. (k % buckets) .. '","endpoint":"' .. endpoint ..
      '","payload":{"data":"' .. payload .. '"}'
    if keyed then job = job .. ',"idempotency_key":"' .. tag .. '-' .. k .. '"' end
    if keys > 0 then job = job .. ',"ordering_key":"key-' .. (math.floor(k / buckets) % keys) .. '"' end
    parts[#parts + 1] = job .. '}'
  end
  return wrk.format("POST", "/v1/jobs", headers, '{"jobs":[' .. table.concat(parts, ",") .. ']}')
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  -- Only numbers and strings cross to the main state: statuses as "202=19 503=1".
  local parts = {}
  for s, n in pairs(statuses) do parts[#parts + 1] = s .. "=" .. n end
  wrk.thread:set("statuses", table.concat(parts, " "))
end

function done(summary, latency, requests)
  local by = {}
  for _, t in ipairs(threads) do
    for s, n in string.gmatch(t:get("statuses") or "", "(%d+)=(%d+)") do
      by[s] = (by[s] or 0) + tonumber(n)
    end
  end
  local parts = {}
  for s, n in pairs(by) do parts[#parts + 1] = s .. " x " .. n end
  table.sort(parts)
  io.write(string.format("submit.lua: answers %s; latency p50 %.1f ms, p99 %.1f ms\n",
    table.concat(parts, ", "), latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
