-- weir cluster leave: a member that stops gives its slots back at once.
-- KEYS[1] the members index, KEYS[2] the heartbeat key, KEYS[3..] the lease
-- hashes; ARGV[1] the member id, ARGV[2] the nudge channel: the others
-- renew at once and take their larger parts.
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[1], ARGV[1])
for i = 3, #KEYS do
  redis.call('HDEL', KEYS[i], ARGV[1])
end
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
