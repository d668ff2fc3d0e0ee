
-- ARGV: key prefix, number of slot ranges R, then R × (first slot, last slot), then per key:
-- field, owner (16 bytes), hash index, range number (1-based).
-- Returns the positions of keys that had an entry of that owner.
local prefix = ARGV[1]
local ranges = {}
local at = 3
for r = 1, tonumber(ARGV[2]) do
  local scan = {}
  for s = tonumber(ARGV[at]), tonumber(ARGV[at + 1]) do
    scan[#scan + 1] = prefix .. string.format('%.0f', s) .. ':'
  end
  ranges[r] = scan
  at = at + 2
end
local out = {}
local position = 0
for i = at, #ARGV, 4 do
  position = position + 1
  local field, owner, hash = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local scan = ranges[tonumber(ARGV[i + 3])]
  local released = false
  for j = 1, #scan do
    local key = scan[j] .. hash
    local value = redis.call('HGET', key, field)
    if value and string.sub(value, 1, 16) == owner then
      redis.call('HDEL', key, field)
      released = true
    end
  end
  if released then
    out[#out + 1] = position
  end
end
return out
