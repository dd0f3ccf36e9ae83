-- cond_done: a notified waiter holds the lock again: its entry ends, the notification used.
-- Until this, the entry stayed NOTIFIED (cond_check, cond_leave with ARGV[2] = 0), so a
-- waiter that died while taking the lock back left the notification to the next waiter.
--
-- KEYS[1]  the queue (see cond_lib.lua)
-- KEYS[2]  the leases
-- ARGV[1]  entry id
-- ARGV[2]  wake-up channel prefix
-- ARGV[3]  'PUBLISH' or 'SPUBLISH'
--
-- Returns 'status value' (scripts.py's one reply contract):
--   '1 0'  ended: the entry was NOTIFIED and is deleted
--   '0 0'  it was still waiting (not notified): the entry is deleted all the same
--   '-1 0' gone already: its lease ended first (the waiter stalled, or its renewals
--          could not reach Redis for a whole lease), and the notification was passed on
--          to the oldest live waiter then
local entry, prefix, publish = ARGV[1], ARGV[2], ARGV[3]
pruned(prefix, publish)
if redis.call('ZREM', KEYS[1], entry) == 1 then
    redis.call('ZREM', KEYS[2], entry)
    return answer(0, 0)
end
if redis.call('ZREM', KEYS[2], entry) == 1 then
    return answer(1, 0)
end
return answer(-1, 0)
