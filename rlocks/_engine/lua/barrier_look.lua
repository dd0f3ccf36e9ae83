-- barrier_look: a waiting party looks at its outcome, renewing its lease.
-- KEYS[1] H;  KEYS[2] L (barrier_lib.lua)
-- ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] parties;  ARGV[4] keep, ms
-- ARGV[5] call (the wait's id);  ARGV[6] entry lease, ms
-- Replies (it changes nothing but its lease and its outcome's collection, and what tidy
-- does: safe to send again):
--   '1 <index> 0'  the generation passed (marked collected: 'c')
--   '0 <index>'    still waiting (lease renewed); '0 -1' still queued
--   '-1 0'         the barrier broke (abort, reset, a time-out, a dead party)
--                  (marked collected: 'd')
--   '-1 1'         its entry is gone: its lease ended (it was counted dead)
local changed = tidy()
local v = redis.call('HGET', H, 'a:' .. ME)
local s, g, i, c = nil, nil, nil, nil
if v then s, g, i, c = parse(v) end
if c ~= ARGV[5] then
    if changed then settle() end
    return reply('-1', 1)
end
local waiting = s == 'w' or s == 'q'
if waiting then
    redis.call('ZADD', L, now_ms() + tonumber(ARGV[6]), ME)
end
if s == 'p' or s == 'b' then
    collect()
    changed = true  -- (its shorter lease may end the keys sooner)
end
if changed then settle() end
if waiting then return reply('0', i) end
if s == 'p' or s == 'c' then return reply('1', i, 0) end
return reply('-1', 0)
