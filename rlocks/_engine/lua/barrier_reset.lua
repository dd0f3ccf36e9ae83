-- barrier_reset: back to the empty, unbroken state (threading's reset): the parties
-- waiting get BrokenBarrierError, and the next generation starts filling at once.
-- KEYS[1] H;  KEYS[2] L (barrier_lib.lua)
-- ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] parties;  ARGV[4] keep, ms
-- The keys go at once when every party recorded has collected its outcome (one not
-- yet collected stays: as in threading, a reset does not undo a pass).
-- Replies: '1' done (also when there was nothing to reset);  '-4 <parties>' H has
-- another parties count: nothing changed.
local other = mismatch()
if other then return reply('-4', other) end
tidy()
if redis.call('EXISTS', H) == 0 then return reply('1') end
conclude('b')
redis.call('HINCRBY', H, 'gen', 1)
redis.call('HSET', H, 'n', 0)
redis.call('HDEL', H, 'broken')
if all_collected() then
    redis.call('DEL', H, L)  -- nobody waits, nobody has an answer to collect
else
    settle()
end
return reply('1')
