-- barrier_abort: break the barrier (threading's abort): every waiting party gets
-- BrokenBarrierError, and so does every wait until barrier_reset.
-- KEYS[1] H;  KEYS[2] L (barrier_lib.lua)
-- ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] parties;  ARGV[4] keep, ms
-- Replies: '1' broken (also when it was);  '-4 <parties>' H has another parties count.
local other = mismatch()
if other then return reply('-4', other) end
tidy()
if redis.call('EXISTS', H) == 0 then
    redis.call('HSET', H, 'parties', PARTIES, 'gen', 0, 'n', 0)
end
if redis.call('HGET', H, 'broken') ~= '1' then break_all() end
settle()
return reply('1')
