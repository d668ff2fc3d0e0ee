
-- ARGV: key prefix, mode ('c' claim | 't' take over | 'f' confirm), pending TTL ms, slot ms, ms a hash outlives
-- its slot, number of slot ranges R, then R × (own slot, first slot, last slot), then per key:
-- field, owner (16 bytes), hash index, range number (1-based). Keys come sorted by hash index
-- and range, so that each run sharing both is one HMGET per slot and one HSET; a run of one key
-- (the usual one: a batch's keys spread over many hashes) reads with HGET and writes at once,
-- without the tables a longer run needs. Both settle a key with the same `note` and `settle`.
-- A confirmation first reads only the keys' own slot: an owner's live entry there settles it
-- (no other owner's entry can share its range, see the dedup module's docs), so only keys whose
-- entry moved, lapsed or vanished pay for the whole range.
-- Returns {position, kind, owner} for keys not newly claimed: kind 1 = the owner's own entry,
-- 2 = another owner's confirmed entry, 3 = another owner's pending entry, 4 = another owner's
-- lapsed pending entry (claim mode only: kept, so the caller can check that its job was never
-- stored before taking the key over; take-over mode deletes it like confirm mode does).
local prefix = ARGV[1]
local confirming = ARGV[2] == 'f'
local careful = ARGV[2] == 'c'
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
local slot_ms = tonumber(ARGV[4])
local keep_ms = tonumber(ARGV[5])
-- Key prefixes are built once per range: formatting a number costs as much as a Redis call.
local ranges = {}
local at = 7
for r = 1, tonumber(ARGV[6]) do
  local slot = tonumber(ARGV[at])
  local scan = {}
  for s = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]) do
    scan[#scan + 1] = prefix .. string.format('%.0f', s) .. ':'
  end
  ranges[r] = {
    own = prefix .. string.format('%.0f', slot) .. ':',
    scan = scan,
    expire_at = string.format('%.0f', (slot + 1) * slot_ms + keep_ms),
  }
  at = at + 3
end
-- Appends `values` to the list of `key` in `map` (lists and the key order are created lazily:
-- this path is rare).
local function append(map, key, a, b)
  map = map or { order = {} }
  local list = map[key]
  if not list then
    list = {}
    map[key] = list
    map.order[#map.order + 1] = key
  end
  list[#list + 1] = a
  if b then
    list[#list + 1] = b
  end
  return map
end
-- Whether `value` is `owner`'s entry, confirmed or pending and not lapsed.
local function held(value, owner)
  return value and string.sub(value, 1, 16) == owner
    and (#value == 16 or tonumber(string.sub(value, 17)) > now)
end
local out = {}
local expiring = {}
local position = 0
-- What the slots of the key being settled hold, gathered by `note`: the slot key of the owner's
-- own live entry and whether it is pending, and the first other owner met.
local mine_key, mine_pending, other, other_pending, other_lapsed
local function clear()
  mine_key, mine_pending, other, other_pending, other_lapsed = nil, false, nil, false, false
end
-- Notes `value`, found at slot key `key`, for a claim by `owner`; true when it is an expired
-- pending entry to delete.
local function note(key, value, owner)
  local pending = #value > 16
  if pending and tonumber(string.sub(value, 17)) <= now then
    if careful and string.sub(value, 1, 16) ~= owner then
      if not other then
        other, other_pending, other_lapsed = string.sub(value, 1, 16), true, true
      end
      return false
    end
    return true
  end
  if string.sub(value, 1, 16) == owner then
    mine_key, mine_pending = key, pending
  elseif not other then
    other, other_pending = string.sub(value, 1, 16), pending
  end
  return false
end
-- Reports the claim at `position` by `owner`: found as noted, or confirmed by the first read
-- (`early`). Returns the slot key its entry is then written to (nil: none), and whether the
-- entry is new (written to `own`).
local function settle(owner, own, early)
  if early or mine_key then
    out[#out + 1] = position
    out[#out + 1] = 1
    out[#out + 1] = owner
    return (not early) and mine_pending and mine_key or nil, false
  elseif other then
    out[#out + 1] = position
    out[#out + 1] = other_lapsed and 4 or (other_pending and 3 or 2)
    out[#out + 1] = other
    return nil, false
  end
  return own, true
end
-- Sets the expiry of `own`, the hash of `range`'s own slot, once per script.
local function expire(own, range)
  if not expiring[own] then
    redis.call('PEXPIREAT', own, range.expire_at)
    expiring[own] = true
  end
end
-- The value a claim by `owner` writes.
local function entry(owner)
  return confirming and owner or (owner .. deadline)
end

-- A run of one key, at ARGV[i].
local function one(i, range)
  position = position + 1
  local field, owner, hash = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local own = range.own .. hash
  if confirming then
    local value = redis.call('HGET', own, field)
    if held(value, owner) then
      if #value > 16 then
        redis.call('HSET', own, field, owner)
      end
      settle(owner, own, true)
      return
    end
  end
  clear()
  local scan = range.scan
  for s = 1, #scan do
    local key = scan[s] .. hash
    local value = redis.call('HGET', key, field)
    if value and note(key, value, owner) then
      redis.call('HDEL', key, field)
    end
  end
  local key, new = settle(owner, own)
  if key then
    redis.call('HSET', key, field, entry(owner))
    if new then
      expire(own, range)
    end
  end
end

-- A run of keys sharing a hash and a range, at ARGV[i] up to ARGV[stop] (excluded).
local function many(i, stop, range)
  local hash = ARGV[i + 2]
  local scan = range.scan
  local count = (stop - i) / 4
  local fields = {}
  for g = 1, count do
    fields[g] = ARGV[i + (g - 1) * 4]
  end
  local own = range.own .. hash
  local quick, settled = nil, false
  if confirming then
    quick = redis.call('HMGET', own, unpack(fields))
    settled = true
    for g = 1, count do
      if not held(quick[g], ARGV[i + (g - 1) * 4 + 1]) then
        settled = false
      end
    end
  end
  local keys, seen = {}, {}
  if not settled then
    for s = 1, #scan do
      keys[s] = scan[s] .. hash
      seen[s] = redis.call('HMGET', keys[s], unpack(fields))
    end
  end
  -- Writes are collected and applied after the run: deletions of expired entries first, then
  -- sets (a new entry may replace an expired one in the same hash). `fresh` is what this run
  -- wrote into `own`, so that a key repeated within the run sees its earlier claim.
  local own_sets = {}
  local deletes, refreshes = nil, nil
  local fresh = {}
  -- Whether an entry is new to `own` (which may then be new, without its expiry).
  local created = false
  for g = 1, count do
    position = position + 1
    local field, owner = fields[g], ARGV[i + (g - 1) * 4 + 1]
    local earlier = fresh[field]
    if quick and held(quick[g], owner) and (not earlier or string.sub(earlier, 1, 16) == owner) then
      if #quick[g] > 16 then
        own_sets[#own_sets + 1] = field
        own_sets[#own_sets + 1] = owner
        fresh[field] = owner
      end
      settle(owner, own, true)
    else
      clear()
      if earlier then
        if string.sub(earlier, 1, 16) == owner then
          mine_key, mine_pending = own, #earlier > 16
        else
          other, other_pending = string.sub(earlier, 1, 16), #earlier > 16
        end
      end
      for s = 1, #scan do
        local value = seen[s][g]
        if value and note(keys[s], value, owner) then
          deletes = append(deletes, keys[s], field)
        end
      end
      local key, new = settle(owner, own)
      if key == own then
        local value = entry(owner)
        own_sets[#own_sets + 1] = field
        own_sets[#own_sets + 1] = value
        fresh[field] = value
        created = created or new
      elseif key then
        refreshes = append(refreshes, key, field, entry(owner))
      end
    end
  end
  if deletes then
    for _, key in ipairs(deletes.order) do
      redis.call('HDEL', key, unpack(deletes[key]))
    end
  end
  if refreshes then
    for _, key in ipairs(refreshes.order) do
      redis.call('HSET', key, unpack(refreshes[key]))
    end
  end
  if #own_sets > 0 then
    redis.call('HSET', own, unpack(own_sets))
    if created then
      expire(own, range)
    end
  end
end

local n = #ARGV
local i = at
while i <= n do
  -- One run: the keys sharing a hash index and a range.
  local hash, number = ARGV[i + 2], ARGV[i + 3]
  local range = ranges[tonumber(number)]
  local stop = i + 4
  while stop <= n and ARGV[stop + 2] == hash and ARGV[stop + 3] == number do
    stop = stop + 4
  end
  if stop == i + 4 then
    one(i, range)
  else
    many(i, stop, range)
  end
  i = stop
end
return out
