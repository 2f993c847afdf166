-- weir cluster: a client's connection, asked for at admission (clients.go).
-- KEYS[1] the members hash (member id -> "started expiry(ms)"), KEYS[2]
-- this member's counts at the scope (client -> "seq:n").
-- ARGV: id, base (a member's counts at the scope are base .. id), client,
-- n (the client's connections here with this one), seq (orders this
-- member's counts of the client), limit, ttl (ms: the counts hash
-- outlives the member's last write or refresh by it).
-- The other members' counts are those of the live ones (expiry not
-- passed). A count recorded with a later seq already includes this
-- connection (it was taken after it, under the same lock): it is judged
-- instead and nothing is written. Returns {1 admitted | 0 refused,
-- the others' connections}.
local id, base, client = ARGV[1], ARGV[2], ARGV[3]
local n, seq, limit, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local others = 0
local mh = redis.call('HGETALL', KEYS[1])
for j = 1, #mh, 2 do
  local m = mh[j]
  local e = tonumber(string.match(mh[j + 1], '^%d+ (%d+)$'))
  if m ~= id and e ~= nil and e > now then
    local v = redis.call('HGET', base .. m, client)
    if v then
      local c = tonumber(string.match(v, ':(%d+)$'))
      if c then others = others + c end
    end
  end
end
local cur = redis.call('HGET', KEYS[2], client)
if cur then
  local s, c = string.match(cur, '^(%d+):(%d+)$')
  if s and tonumber(s) > seq then
    n = tonumber(c)
    if others + n > limit then return {0, others} end
    return {1, others}
  end
end
if others + n > limit then return {0, others} end
redis.call('HSET', KEYS[2], client, seq .. ':' .. n)
redis.call('PEXPIRE', KEYS[2], ttl)
return {1, others}
