-- weir cluster tick: one round trip per lease interval per instance.
-- KEYS[1] the members index (a set of ids), KEYS[2] this member's heartbeat
-- key, KEYS[3..] one lease hash per enforced level.
-- ARGV: id, ttl (ms), started (Unix ms), member key prefix, then per level
-- limit, want, floor.
-- A lease hash maps member id -> "slots want expiry(ms)". A field whose
-- expiry passed is a dead member's and is deleted. Every key shares the
-- cluster's hash tag, so a Redis Cluster runs the script on one node.
-- Returns {nmembers, id, started, pttl, ..., grant, record, held, wants, ...}.
local id, ttl, started, prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[2], started, 'PX', ttl)
redis.call('SADD', KEYS[1], id)
redis.call('PEXPIRE', KEYS[1], ttl * 4)
local out = {0}
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local left = redis.call('PTTL', prefix .. m)
  if left <= 0 then
    redis.call('SREM', KEYS[1], m)
  else
    out[1] = out[1] + 1
    out[#out + 1] = m
    out[#out + 1] = redis.call('GET', prefix .. m) or '0'
    out[#out + 1] = left
  end
end
local exp = now + ttl
for i = 3, #KEYS do
  local a = 5 + (i - 3) * 3
  local limit, want, floor = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local others, wants = 0, want
  local h = redis.call('HGETALL', KEYS[i])
  for j = 1, #h, 2 do
    if h[j] ~= id then
      local s, w, e = string.match(h[j + 1], '^(%d+) (%d+) (%d+)$')
      if s == nil or tonumber(e) <= now then
        redis.call('HDEL', KEYS[i], h[j])
      else
        others = others + tonumber(s)
        wants = wants + tonumber(w)
      end
    end
  end
  local grant = math.min(want, limit - others)
  if wants > limit and wants > 0 then
    -- Contention: a member's grant tends to its part of the demand (rounded
    -- up; the free slots still bound it), so that slots follow demand.
    grant = math.min(grant, math.ceil(limit * want / wants))
  end
  if grant < 0 then grant = 0 end
  local record = math.max(grant, floor)
  if record == 0 and want == 0 then
    redis.call('HDEL', KEYS[i], id)
  else
    redis.call('HSET', KEYS[i], id, record .. ' ' .. want .. ' ' .. exp)
    redis.call('PEXPIRE', KEYS[i], ttl * 4)
  end
  out[#out + 1] = grant
  out[#out + 1] = record
  out[#out + 1] = others + record
  out[#out + 1] = wants
end
return out
