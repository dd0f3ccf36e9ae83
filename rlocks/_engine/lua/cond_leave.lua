-- cond_leave: a waiter's entry goes: it holds the lock again after a notification
-- (done), or it gives up (time-out, interrupt).
-- KEYS[1] C (cond_lib.lua);  ARGV[1] owner;  ARGV[2] wake prefix
-- ARGV[3] '1' = pass a notification it had on to the next waiter (an interrupted waiter
--         that will not use it), '0' = it used it, '2' = leave only if not notified (a
--         waiter out of time: a notification that came just now is kept for it to use)
-- Replies: '1' it had been notified; '0' it had not; '-1' it had no entry.
tidy()
local m, notified = mine()
if m == nil then return reply('-1') end
if ARGV[3] == '2' and notified then return reply('1') end
redis.call('ZREM', C, m)
if notified and ARGV[3] == '1' then notify(1) end
return reply(notified and '1' or '0')
