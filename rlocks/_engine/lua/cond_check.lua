-- cond_check: a waiter looks at its entry (woken, or at the end of a wait slice): take the
-- notification if there is one, else renew the entry's lease and go on waiting.
--
-- KEYS[1]  the queue (see cond_lib.lua)
-- KEYS[2]  the leases
-- ARGV[1]  entry id
-- ARGV[2]  lease, ms (> 0): the entry's new lease if it is still waiting
-- ARGV[3]  wake-up channel prefix
-- ARGV[4]  'PUBLISH' or 'SPUBLISH'
--
-- Returns 'status value' (scripts.py's one reply contract):
--   '1 1'   notified: the entry is deleted (the notification is taken)
--   '0 ms'  still waiting; its lease was renewed to ms
--   '-1 0'  gone: the lease ended before this look (the waiter stalled); a
--           notification it had was passed on to the oldest live waiter
local entry, lease_ms, prefix, publish = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local now = pruned(prefix, publish)
if redis.call('ZSCORE', KEYS[1], entry) then
    redis.call('ZADD', KEYS[2], now + lease_ms, entry)
    keep_alive(KEYS[1], KEYS[2])
    return answer(0, lease_ms)
end
if redis.call('ZREM', KEYS[2], entry) == 1 then
    return answer(1, 1)
end
return answer(-1, 0)
