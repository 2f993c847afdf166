-- weir cluster borrow: one round trip for a limit whose local share is
-- full. KEYS[1] the lease hash; ARGV: id, hold (ms), nudge channel ('':
-- do not publish),
-- limit, ask (the share asked for), cur (the share held now), open,
-- demand (the connections open and waiting).
-- The members are the fields whose expiry has not passed; this member's
-- own must be live (an expired lease is renewed, not borrowed on).
-- Grants min(ask, this member's part of alloc with its demand raised to
-- demand, limit - the others' leases) when that is above cur, and records it
-- (never lower than what was recorded) before the caller raises its
-- share, so the recorded leases still bound the open connections.
-- Otherwise it records the demand (the others see this member below its
-- part) and, when another member holds slots above its part (it may no
-- longer use them: its recorded open count is as old as its last
-- renewal), publishes on the own nudge channel of enough of the members
-- above their part to cover what it asks (the largest excess first), so
-- that they give them back.
-- Returns {grant, held, nudged}: grant <= cur means nothing granted.
local id, hold, channel = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local limit, ask, cur, open = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local demand = tonumber(ARGV[8])
local now = now_ms()
local others, mine, mywant, myexp = 0, -1, 0, 0
local ids, d, s, o = {}, {}, {}, {}
local h = redis.call('HGETALL', KEYS[1])
for j = 1, #h, 2 do
  local m = h[j]
  local fs, fw, fe, fo = parse(h[j + 1])
  if fs ~= nil and fe + hold > now then
    if m == id then
      mine, mywant, myexp = fs, fw, fe
    else
      others = others + fs
    end
    if fe > now then
      ids[#ids + 1] = m
      d[m], s[m], o[m] = fw, fs, fo
    end
  end
end
if mine < 0 or myexp <= now then
  return {cur, others + math.max(mine, 0), 0}
end
d[id] = math.max(mywant, demand)
table.sort(ids)
local t = alloc(limit, ids, d)
local grant = math.min(ask, t[id], limit - others)
if grant > cur then
  local record = math.max(grant, mine)
  redis.call('HSET', KEYS[1], id, record .. ' ' .. d[id] .. ' ' .. myexp .. ' ' .. open)
  return {grant, others + record, 0}
end
redis.call('HSET', KEYS[1], id, mine .. ' ' .. d[id] .. ' ' .. myexp .. ' ' .. open)
-- Any slot above a member's part counts here, without the renewals'
-- slack: a connection waits on this answer, and a burst's first borrow,
-- whose demand does not yet count the refusals racing it, asks for less
-- than a slack's worth (a member at 10 for a part of 9 was not nudged,
-- and the borrow refused at once while the others waited).
local excess, spare = {}, false
for _, m in ipairs(ids) do
  if m ~= id and s[m] > t[m] then
    excess[m] = s[m] - t[m]
    spare = true
  end
end
local need = math.min(ask, t[id]) - cur
if spare and need > 0 then
  -- channel '': nudged lately, the members are renewing already.
  if channel ~= '' then
    for _, m in ipairs(enough(ids, excess, need)) do
      redis.call('PUBLISH', channel .. ':' .. m, id)
    end
  end
  return {cur, others + mine, 1}
end
return {cur, others + mine, 0}
