-- cond_check: a waiter looks at its entry (woken, or at the end of a wait slice): renew the
-- entry's lease, and say whether it was notified. A notified entry is kept (NOTIFIED) while
-- the waiter takes the lock back, and ended by cond_done once it holds it: a waiter that
-- dies in between leaves the notification to the next waiter when the lease ends.
--
-- KEYS[1]  the queue (see cond_lib.lua)
-- KEYS[2]  the leases
-- ARGV[1]  entry id
-- ARGV[2]  lease, ms (> 0): the entry's new lease
-- ARGV[3]  wake-up channel prefix
-- ARGV[4]  'PUBLISH' or 'SPUBLISH'
--
-- Returns 'status value' (scripts.py's one reply contract):
--   '1 1'   notified: the entry is kept, its lease renewed, until cond_done (or
--           cond_leave) ends it; a second look answers the same
--   '0 ms'  still waiting; its lease was renewed to ms
--   '-1 0'  gone: the lease ended before this look (the waiter stalled, or Redis was
--           out of its reach that long); a notification it had was passed on to the
--           oldest live waiter
-- (The lock's renewer also runs it, to renew a notified entry kept while its waiter
-- takes the lock back: condition.py, _KeptEntry.)
local entry, lease_ms, prefix, publish = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local now = pruned(prefix, publish)
if redis.call('ZSCORE', KEYS[1], entry) then
    redis.call('ZADD', KEYS[2], now + lease_ms, entry)
    keep_alive(KEYS[1], KEYS[2])
    return answer(0, lease_ms)
end
if redis.call('ZSCORE', KEYS[2], entry) then
    redis.call('ZADD', KEYS[2], now + lease_ms, entry)
    keep_alive(KEYS[1], KEYS[2])
    return answer(1, 1)
end
return answer(-1, 0)
