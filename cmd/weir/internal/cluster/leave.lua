-- weir cluster leave: a member that stops gives its slots back at once.
-- KEYS[1] the members hash, KEYS[2..] the lease hashes; ARGV[1] the
-- member id, ARGV[2] the nudge channel: the others renew at once and take
-- their larger parts.
redis.call('HDEL', KEYS[1], ARGV[1])
for i = 2, #KEYS do
  redis.call('HDEL', KEYS[i], ARGV[1])
end
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
