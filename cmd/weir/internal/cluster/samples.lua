-- weir cluster samples: one round trip per sampling interval per instance.
-- KEYS[1] the prefix of the sample hashes ("weir:{NAME}:samples:").
-- ARGV: id, sampling interval (ms), this member's sample (JSON).
-- The sample goes into the hash of the epoch Redis's clock is in (one
-- clock for every member), floor(now / interval); the answer is the
-- previous epoch's hash, complete by now: {epoch, id, sample, ...}. Every
-- member reads the same previous epoch, so all judge the same sums.
local id, iv = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local e = math.floor(now / iv)
local key = KEYS[1] .. iv .. ':'
redis.call('HSET', key .. e, id, ARGV[3])
redis.call('PEXPIRE', key .. e, iv * 3)
local out = {e}
local h = redis.call('HGETALL', key .. (e - 1))
for j = 1, #h do
  out[#out + 1] = h[j]
end
return out
