-- barrier_break: a party gives up: its time-out ran out, it was interrupted or
-- cancelled, or its action raised. As threading's, a party that gives up after it
-- arrived breaks the barrier for every party waiting.
-- KEYS[1] H;  KEYS[2] L (barrier_lib.lua)
-- ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] parties;  ARGV[4] keep, ms
-- ARGV[5] call (the wait's id)
-- ARGV[6] 't' timed out: break only if it waits and no action runs (an action's
--         generation is as good as passed, as in threading); 'x' leaving whatever
--         its state: an arrival breaks the barrier, a queued entry just goes
-- Replies:
--   '1 <index> 0'  its generation had passed: nothing broken (the party uses it)
--   '0 <index>'    't' while an action runs, or '0 -1' while queued: it keeps waiting
--   '-1 0'         the barrier is broken (by this call, or before)
--   '-1 1'         it had no entry (never arrived, or its lease ended)
local changed = tidy()
local v = redis.call('HGET', H, 'a:' .. ME)
local s, g, i, c = nil, nil, nil, nil
if v then s, g, i, c = parse(v) end
if c ~= ARGV[5] then
    if changed then settle() end
    return reply('-1', 1)
end
if s ~= 'w' and s ~= 'a' and s ~= 'q' then
    -- Its outcome is given already: nothing to break.
    if changed then settle() end
    if s == 'p' or s == 'c' then return reply('1', i, 0) end
    return reply('-1', 0)
end
if ARGV[6] == 't' and (s == 'q' or redis.call('HEXISTS', H, 'act') == 1) then
    if changed then settle() end
    return reply('0', i)
end
if s == 'q' then
    redis.call('HDEL', H, 'a:' .. ME)
    redis.call('ZREM', L, ME)
else
    break_all()
end
settle()
return reply('-1', 0)
