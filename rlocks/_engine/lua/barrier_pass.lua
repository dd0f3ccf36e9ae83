-- barrier_pass: the last arriver ran the action: its generation passes.
-- KEYS[1] H;  KEYS[2] L (barrier_lib.lua)
-- ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] parties;  ARGV[4] keep, ms
-- ARGV[5] call (the wait's id)
-- Replies:
--   '1 <index> 0'  passed (also for a re-send that finds it passed)
--   '-1 0'         the barrier broke while the action ran (abort, reset, or the
--                  action outlived its lease and a waiting party broke it)
--   '-1 1'         its entry is gone
local changed = tidy()
local v = redis.call('HGET', H, 'a:' .. ME)
local s, g, i, c = nil, nil, nil, nil
if v then s, g, i, c = parse(v) end
if c ~= ARGV[5] then
    if changed then settle() end
    return reply('-1', 1)
end
if s == 'a' then
    pass()
    collect()  -- (its answer is this reply)
    settle()
    return reply('1', i, 0)
end
if changed then settle() end
if s == 'p' or s == 'c' then return reply('1', i, 0) end
return reply('-1', 0)
