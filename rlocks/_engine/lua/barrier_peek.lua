-- barrier_peek: how many parties wait, and whether the barrier is broken (after
-- dropping the parties whose lease ended: a dead waiting party breaks it here too).
-- KEYS[1] H;  KEYS[2] L (barrier_lib.lua)
-- ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] parties;  ARGV[4] keep, ms
-- Replies: '1 <waiting> <broken 1/0>' (waiting is 0 while broken);
--          '-4 <parties>' H has another parties count.
local other = mismatch()
if other then return reply('-4', other) end
if tidy() then settle() end
if redis.call('HGET', H, 'broken') == '1' then return reply('1', 0, 1) end
return reply('1', tonumber(redis.call('HGET', H, 'n') or '0'), 0)
