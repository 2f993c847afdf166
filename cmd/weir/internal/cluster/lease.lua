-- weir cluster tick: one round trip per lease interval per instance.
-- KEYS[1] the members index (a set of ids), KEYS[2] this member's heartbeat
-- key, KEYS[3..] one lease hash per shared limit.
-- ARGV: id, ttl (ms), started (Unix ms), member key prefix, hold (ms: how
-- long a field outlives its expiry, its slots still counted as held),
-- nudge channel, then per limit: limit, want (the local demand; < 0: the
-- limit is no longer shared here, its field is deleted), floor
-- (the lease is never recorded below it: what may be in use), cap (no
-- grant above it), cur (the share held now), open.
-- A lease hash maps member id -> "slots want expiry(ms) open". A field
-- whose expiry passed more than hold ago is a dead member's and is
-- deleted; one within hold still holds its slots but is no member.
-- Every key shares the cluster's hash tag, so a Redis Cluster runs the
-- script on one node.
-- A member aims at its part of alloc; it is granted that part out of
-- what the others' leases leave, and it keeps a larger share unless
-- another member is below its part. When this member is below its part
-- while another holds slots above its own part (which it may no longer
-- use: the open count it recorded is as old as its last renewal), or
-- when it joins, it publishes on the nudge channel: the
-- others renew at once and give those slots back.
-- Returns {nmembers, id, started, pttl, ..., then per limit grant,
-- record, held, wants, short, spare} (short: 1 when another member is
-- below its part, so that this one gives back slots as its connections
-- close; spare: 1 when another holds slots above its part, so that this one renews early when its share is full).
local id, ttl, started, prefix = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local hold, channel = tonumber(ARGV[5]), ARGV[6]
local now = now_ms()
redis.call('SET', KEYS[2], started, 'PX', ttl)
local joined = redis.call('SADD', KEYS[1], id) == 1
redis.call('PEXPIRE', KEYS[1], ttl * 4)
local out = {0}
local ids = {}
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local left = redis.call('PTTL', prefix .. m)
  if left <= 0 then
    redis.call('SREM', KEYS[1], m)
  else
    out[1] = out[1] + 1
    out[#out + 1] = m
    out[#out + 1] = redis.call('GET', prefix .. m) or '0'
    out[#out + 1] = left
    ids[#ids + 1] = m
  end
end
table.sort(ids)
local live = {}
for _, m in ipairs(ids) do live[m] = true end
local nudge = joined
local exp = now + ttl
for i = 3, #KEYS do
  local a = 7 + (i - 3) * 6
  local limit, want, floor = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cap, cur, open = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  -- want < 0: the limit is no longer shared here; its field goes (an idle
  -- member keeps one, 0 slots, so that it can borrow).
  local gone = want < 0
  if gone then want = 0 end
  local others, wants = 0, want
  local d, s, o = {}, {}, {}
  for _, m in ipairs(ids) do d[m], s[m], o[m] = 0, 0, 0 end
  d[id] = want
  local h = redis.call('HGETALL', KEYS[i])
  for j = 1, #h, 2 do
    local m = h[j]
    if m ~= id then
      local fs, fw, fe, fo = parse(h[j + 1])
      if fs == nil or fe + hold <= now then
        redis.call('HDEL', KEYS[i], m)
      else
        others = others + fs
        if live[m] and fe > now then
          d[m], s[m], o[m] = fw, fs, fo
          wants = wants + fw
        end
      end
    end
  end
  local t = alloc(limit, ids, d)
  local short, spare = false, false
  for _, m in ipairs(ids) do
    if m ~= id then
      if t[m] > s[m] then short = true end
      if s[m] > t[m] + slack(t[m]) then spare = true end
    end
  end
  local free = math.max(limit - others, 0)
  local grant = math.min(t[id], cap, free)
  if grant < cur and not short then
    -- Nobody is below its part: keep what is held (no churn).
    grant = math.min(cur, cap, free)
  end
  if grant < 0 then grant = 0 end
  if t[id] > grant + slack(t[id]) and spare then nudge = true end
  local record = math.max(grant, floor)
  if gone then
    redis.call('HDEL', KEYS[i], id)
    grant, record = 0, 0
  else
    redis.call('HSET', KEYS[i], id, record .. ' ' .. want .. ' ' .. exp .. ' ' .. open)
    redis.call('PEXPIRE', KEYS[i], ttl * 4)
  end
  out[#out + 1] = grant
  out[#out + 1] = record
  out[#out + 1] = others + record
  out[#out + 1] = wants
  out[#out + 1] = short and 1 or 0
  out[#out + 1] = spare and 1 or 0
end
if nudge then redis.call('PUBLISH', channel, id) end
return out
