-- weir cluster: this member's client counts at one scope, recorded after
-- they changed without an admission (a release) or could not be recorded
-- then (clients.go).
-- KEYS[1] this member's counts at the scope (client -> "seq:n").
-- ARGV: ttl (ms), then per client: client, n, seq. A count recorded with
-- a later seq is newer and stays; 0 deletes the client's field. Returns
-- the hash's size.
local ttl = tonumber(ARGV[1])
for j = 2, #ARGV, 3 do
  local client, n, seq = ARGV[j], tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local cur = redis.call('HGET', KEYS[1], client)
  local s = nil
  if cur then s = tonumber(string.match(cur, '^(%d+):')) end
  if s == nil or s < seq then
    if n > 0 then
      redis.call('HSET', KEYS[1], client, seq .. ':' .. n)
    else
      redis.call('HDEL', KEYS[1], client)
    end
  end
end
local size = redis.call('HLEN', KEYS[1])
if size > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return size
