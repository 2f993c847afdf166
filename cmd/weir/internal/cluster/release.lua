-- weir cluster release: right after a renewal lowered this member's
-- shares, the smaller leases are recorded (the share was lowered first,
-- so they still bound what is in use), and the others are told on the
-- nudge channel when one is below its part (one that joined and has no
-- lease yet, or one whose demand grew) takes the slots at once.
-- KEYS[1..] the lease hashes; ARGV: id, nudge channel ('': nobody is
-- below its part, no nudge), then per key the
-- slots to record.
local id, channel = ARGV[1], ARGV[2]
for i = 1, #KEYS do
  local v = redis.call('HGET', KEYS[i], id)
  if v then
    local s, w, e, o = parse(v)
    local n = tonumber(ARGV[2 + i])
    if s ~= nil and n < s then
      redis.call('HSET', KEYS[i], id, n .. ' ' .. w .. ' ' .. e .. ' ' .. o)
    end
  end
end
if channel ~= '' then redis.call('PUBLISH', channel, id) end
return 1
