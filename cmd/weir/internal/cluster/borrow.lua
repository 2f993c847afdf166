-- weir cluster borrow: one round trip for a level whose local share is
-- full. KEYS[1] the level's lease hash; ARGV: id, ttl (ms), limit, want
-- (the share asked for), cur (the share held now).
-- Grants min(want, limit - the others' live leases) when that is above
-- cur, and records it (never lower than what was recorded) before the
-- caller raises its share, so the recorded leases still bound the open
-- connections. It grants nothing while another live member has unmet
-- demand (its recorded want above its lease): slots under contention are
-- split by the renewals in proportion to demand (lease.lua), and a borrow
-- would hand every slot that frees to the member whose clients retry
-- fastest.
-- Returns {grant, held}: grant <= cur means nothing granted.
local id, ttl = ARGV[1], tonumber(ARGV[2])
local limit, want, cur = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local others, unmet, mine, mywant, myexp = 0, false, 0, 0, now + ttl
local h = redis.call('HGETALL', KEYS[1])
for j = 1, #h, 2 do
  local s, w, e = string.match(h[j + 1], '^(%d+) (%d+) (%d+)$')
  if h[j] == id then
    if s ~= nil then mine, mywant, myexp = tonumber(s), tonumber(w), tonumber(e) end
  elseif s ~= nil and tonumber(e) > now then
    others = others + tonumber(s)
    unmet = unmet or tonumber(w) > tonumber(s)
  end
end
local grant = math.min(want, limit - others)
if unmet then
  grant = cur
end
if grant <= cur then
  return {cur, others + math.max(mine, cur)}
end
local record = math.max(grant, mine)
redis.call('HSET', KEYS[1], id, record .. ' ' .. math.max(mywant, grant) .. ' ' .. myexp)
redis.call('PEXPIRE', KEYS[1], ttl * 4)
return {grant, others + record}
