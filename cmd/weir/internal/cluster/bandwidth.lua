-- weir cluster bandwidth: one round trip per recompute interval per
-- instance that has a level with a maxBandwidth.
-- KEYS[1..] one hash per level: member id -> "rate expiry(ms)".
-- ARGV: id, ttl (ms), then this member's window rate (bytes/s) per key.
-- Returns, per key, the sum of the other live members' rates; a field whose
-- expiry passed is a dead member's and is deleted.
local id, ttl = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  redis.call('HSET', KEYS[i], id, ARGV[2 + i] .. ' ' .. (now + ttl))
  redis.call('PEXPIRE', KEYS[i], ttl * 4)
  local others = 0
  local h = redis.call('HGETALL', KEYS[i])
  for j = 1, #h, 2 do
    if h[j] ~= id then
      local r, e = string.match(h[j + 1], '^(%d+) (%d+)$')
      if r == nil or tonumber(e) <= now then
        redis.call('HDEL', KEYS[i], h[j])
      else
        others = others + tonumber(r)
      end
    end
  end
  out[i] = others
end
return out
