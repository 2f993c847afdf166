-- weir cluster allocation, shared by lease.lua, borrow.lua and
-- release.lua (prepended to each). Every member aims at the same
-- deterministic split of a limit over the live members, from the demands
-- recorded in Redis (a member's demand: its open connections and those
-- its share refused since its last renewal). Each member also has a spare,
-- a quarter of its demand and at least one, so that it admits its next
-- connections at once. In that order:
--   * demands and spares fit in the limit: each member gets its demand,
--     its spare and an even part of the rest (the remainder to the first
--     ids), so that an idle member holds its even part of the limit and
--     admits a burst at once;
--   * the demands fit but not the spares: each gets its demand, and the
--     rest goes to the spares in proportion;
--   * contention (the demands exceed the limit): each gets its part of
--     the limit in proportion to its demand, no spare.
-- Proportional parts are rounded down and the remainder goes to the
-- largest fractions, ties to the first ids. ids is the sorted list of
-- live members, w maps id -> demand; returns id -> part.
-- The order of the remainders is one number per member, sorted without
-- a comparison function (a Lua comparator made the split the largest
-- part of a renewal at 100 members): the fraction in 2^-30 steps, then
-- the rank, larger first.
local function split(total, ids, weight)
  local sum = 0
  for _, x in ipairs(ids) do sum = sum + weight[x] end
  local t, given, keys, at = {}, 0, {}, {}
  local n = #ids
  for r, x in ipairs(ids) do
    local exact = 0
    if sum > 0 then exact = total * weight[x] / sum end
    t[x] = math.floor(exact)
    given = given + t[x]
    local k = math.floor((exact - t[x]) * 1073741824) * (n + 1) + (n - r)
    keys[r] = k
    at[k] = x
  end
  local rest = math.min(total - given, n)
  if rest > 0 then
    table.sort(keys)
    for j = n, n - rest + 1, -1 do
      local x = at[keys[j]]
      t[x] = t[x] + 1
    end
  end
  return t
end

local function alloc(limit, ids, w)
  local n, sw, ss = #ids, 0, 0
  local sp = {}
  for _, x in ipairs(ids) do
    sp[x] = math.max(1, math.ceil(w[x] / 4))
    sw, ss = sw + w[x], ss + sp[x]
  end
  local t = {}
  if n == 0 then return t end
  if sw + ss <= limit then
    local extra = limit - sw - ss
    local each, rest = math.floor(extra / n), extra % n
    for r, x in ipairs(ids) do
      t[x] = w[x] + sp[x] + each
      if r <= rest then t[x] = t[x] + 1 end
    end
    return t
  end
  if sw <= limit then
    local s = split(limit - sw, ids, sp)
    for _, x in ipairs(ids) do t[x] = w[x] + s[x] end
    return t
  end
  return split(limit, ids, w)
end

-- enough picks, out of the members m in ids with amount[m] > 0 (by
-- how much each holds above its part, or lacks below it), the largest
-- first (ties to the first ids), until their amounts cover need: the
-- members a nudge names. At 100 members under contention every renewal
-- finds some below and some above their part; naming them all made each
-- nudge wake dozens of members and Redis the bottleneck.
local function enough(ids, amount, need)
  local keys, at, n = {}, {}, #ids
  for r, m in ipairs(ids) do
    local a = amount[m]
    if a ~= nil and a > 0 then
      local k = math.min(a, 1073741824) * (n + 1) + (n - r)
      keys[#keys + 1] = k
      at[k] = m
    end
  end
  table.sort(keys)
  local out, got = {}, 0
  for j = #keys, 1, -1 do
    if got >= need then break end
    local m = at[keys[j]]
    out[#out + 1] = m
    got = got + amount[m]
  end
  return out
end

-- slack is how far a member's lease may exceed its part before the others
-- nudge it (an eighth of the part: none for parts below 8): under
-- contention the demands, refusals since the last renewal, move a little
-- at every renewal, and without it the members would nudge each other at
-- every one. (A member below its part by any amount still makes the
-- others give back at their renewals.)
local function slack(part)
  return math.floor(part / 8)
end

-- parse reads a lease field "slots want expiry open" (open may be absent
-- in a field an older weir wrote).
local function parse(v)
  local s, w, e, o = string.match(v, '^(%d+) (%d+) (%d+) ?(%d*)$')
  if s == nil then return nil end
  if o == '' then o = s end
  return tonumber(s), tonumber(w), tonumber(e), tonumber(o)
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
