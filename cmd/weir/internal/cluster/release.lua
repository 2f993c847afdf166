-- weir cluster release: right after a renewal lowered this member's
-- shares, the smaller leases are recorded (the share was lowered first,
-- so they still bound what is in use), and enough of the members below
-- their part to take the slots freed (one that joined and has no lease
-- yet, or one whose demand grew; the largest lack first) are told on
-- their own nudge channels, so that they take the slots at once.
-- KEYS[1..] the lease hashes; ARGV: id, nudge channel ('': nobody is
-- below its part, no nudge), then per key the limit and the
-- slots to record.
local id, channel = ARGV[1], ARGV[2]
local now = now_ms()
local below = {}
for i = 1, #KEYS do
  local limit, n = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  local h = redis.call('HGETALL', KEYS[i])
  local ids, d, s = {}, {}, {}
  local freed = 0
  for j = 1, #h, 2 do
    local m = h[j]
    local fs, fw, fe, fo = parse(h[j + 1])
    if fs ~= nil and m == id and n < fs then
      redis.call('HSET', KEYS[i], id, n .. ' ' .. fw .. ' ' .. fe .. ' ' .. fo)
      freed = fs - n
      fs = n
    end
    if fs ~= nil and fe > now then
      ids[#ids + 1] = m
      d[m], s[m] = fw, fs
    end
  end
  if channel ~= '' and freed > 0 and #ids > 1 then
    table.sort(ids)
    local t = alloc(limit, ids, d)
    local lack = {}
    for _, m in ipairs(ids) do
      if m ~= id and t[m] > s[m] then lack[m] = t[m] - s[m] end
    end
    -- Enough of them to take what was freed, the largest lack first.
    for _, m in ipairs(enough(ids, lack, freed)) do below[m] = true end
  end
end
local to = {}
for m in pairs(below) do to[#to + 1] = m end
table.sort(to)
for _, m in ipairs(to) do redis.call('PUBLISH', channel .. ':' .. m, id) end
return 1
