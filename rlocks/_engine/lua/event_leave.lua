-- event_leave: a waiter's entry goes (it returns, times out, or is interrupted).
-- KEYS[1] H, KEYS[2] Q (event_lib.lua);  ARGV[1] member '<owner>#<wait>'
-- Replies: '1' the Event is set, or a set() had told this waiter (a waiter out of time
--          returns True for it); '0' neither. Either way its entry is gone (Q too, when
--          it was the last).
local member = ARGV[1]
local told = redis.call('ZREM', Q, '!' .. member) == 1
redis.call('ZREM', Q, member)
return reply((told or is_set()) and '1' or '0')
