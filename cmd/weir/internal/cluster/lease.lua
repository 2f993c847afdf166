-- weir cluster tick: one round trip per lease interval per instance.
-- KEYS[1] the members hash (member id -> "started expiry(ms)"), KEYS[2..]
-- one lease hash per shared limit.
-- ARGV: id, ttl (ms), started (Unix ms), hold (ms: how
-- long a field outlives its expiry, its slots still counted as held),
-- nudge channel, full ('1': renew this member's record in the members
-- hash and return the members; '0': the leases only), then per limit:
-- limit, want (the local demand; < 0: the
-- limit is no longer shared here, its field is deleted), floor
-- (the lease is never recorded below it: what may be in use), cap (no
-- grant above it), cur (the share held now), open.
-- The members hash is read by one renewal an interval (full); the
-- others, early or nudged, read only the lease hashes, so that they cost
-- a fixed number of commands (a set of ids and a key per member, read at
-- every renewal, cost two commands per member).
-- A lease hash maps member id -> "slots want expiry(ms) open". The
-- members at a level are the fields whose expiry has not passed; a field
-- whose expiry passed more than hold ago is a dead member's and is
-- deleted; one within hold still holds its slots but is no member.
-- Every key shares the cluster's hash tag, so a Redis Cluster runs the
-- script on one node.
-- A member aims at its part of alloc; it is granted that part out of
-- what the others' leases leave, and it keeps a larger share unless
-- another member is below its part. When this member is below its part
-- (or joins) while others hold slots above their own part (which they
-- may no longer use: the open count they recorded is as old as their
-- last renewal), it publishes on the own nudge channel (the channel, ':'
-- and the id) of enough of them to cover what it lacks, the largest
-- excess first (all of them when it joined): they renew at once and give
-- those slots back; the others are not woken.
-- Returns {nmembers, id, started, pttl, ..., then per
-- limit grant, record, held, wants, short, spare} (short: 1 when another
-- member is below its part, so that this one gives back slots as its
-- connections close; spare: 1 when another holds slots above its part,
-- so that this one renews early when its share is full); not full,
-- {-1, the members hash's size (members live or dead since the last full
-- renewal), then per limit ...}.
local id, ttl, started = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local hold, channel, full = tonumber(ARGV[4]), ARGV[5], ARGV[6] == '1'
local now = now_ms()
local joined = false
local out = {-1, redis.call('HLEN', KEYS[1])}
if full then
  joined = redis.call('HSET', KEYS[1], id, started .. ' ' .. (now + ttl)) == 1
  redis.call('PEXPIRE', KEYS[1], ttl * 4)
  out = {0}
  local mh = redis.call('HGETALL', KEYS[1])
  for j = 1, #mh, 2 do
    local m = mh[j]
    local st, e = string.match(mh[j + 1], '^(%d+) (%d+)$')
    if st == nil or tonumber(e) <= now then
      redis.call('HDEL', KEYS[1], m)
    else
      out[1] = out[1] + 1
      out[#out + 1] = m
      out[#out + 1] = st
      out[#out + 1] = tonumber(e) - now
    end
  end
end
-- The members to nudge: above their part at a level where this one is
-- below its own (or joined).
local nudge = {}
local exp = now + ttl
for i = 2, #KEYS do
  local a = 7 + (i - 2) * 6
  local limit, want, floor = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cap, cur, open = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  -- want < 0: the limit is no longer shared here; its field goes (an idle
  -- member keeps one, 0 slots, so that it can borrow).
  local gone = want < 0
  if gone then want = 0 end
  -- The members at this level are the fields whose expiry has not
  -- passed, and this one.
  local others, wants = 0, want
  local ids, d, s = {id}, {}, {}
  d[id], s[id] = want, 0
  local h = redis.call('HGETALL', KEYS[i])
  for j = 1, #h, 2 do
    local m = h[j]
    if m ~= id then
      local fs, fw, fe = parse(h[j + 1])
      if fs == nil or fe + hold <= now then
        redis.call('HDEL', KEYS[i], m)
      else
        others = others + fs
        if fe > now then
          ids[#ids + 1] = m
          d[m], s[m] = fw, fs
          wants = wants + fw
        end
      end
    end
  end
  table.sort(ids)
  local t = alloc(limit, ids, d)
  local short, spare = false, false
  local excess = {}
  for _, m in ipairs(ids) do
    if m ~= id then
      if t[m] > s[m] then short = true end
      if s[m] > t[m] + slack(t[m]) then
        spare = true
        excess[m] = s[m] - t[m]
      end
    end
  end
  local free = math.max(limit - others, 0)
  local grant = math.min(t[id], cap, free)
  if grant < cur and not short then
    -- Nobody is below its part: keep what is held (no churn).
    grant = math.min(cur, cap, free)
  end
  if grant < 0 then grant = 0 end
  -- A member that joined names every member above its part; one below
  -- its part names only enough of them to cover what it lacks, the
  -- largest excess first.
  if spare and joined then
    for m in pairs(excess) do nudge[m] = true end
  elseif spare and t[id] > grant + slack(t[id]) then
    for _, m in ipairs(enough(ids, excess, t[id] - grant)) do nudge[m] = true end
  end
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
local to = {}
for m in pairs(nudge) do to[#to + 1] = m end
if #to > 0 then
  for _, m in ipairs(to) do redis.call('PUBLISH', channel .. ':' .. m, id) end
end
return out
