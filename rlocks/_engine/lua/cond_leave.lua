-- cond_leave: a waiter stops waiting (time-out, or an error while waiting or taking the
-- lock back): a waiting entry leaves the condition; the reply says whether it had been
-- notified meanwhile.
--
-- KEYS[1]  the queue (see cond_lib.lua)
-- KEYS[2]  the leases
-- ARGV[1]  entry id
-- ARGV[2]  1 = pass a notification the entry had on to the oldest live waiter (the
--          leaver is unwinding an error and will not act on it); 0 = the leaver takes
--          it: the entry is kept (NOTIFIED), its lease renewed, until cond_done ends it
--          once the waiter holds the lock again
-- ARGV[3]  lease, ms (> 0): the kept entry's new lease (ARGV[2] = 0)
-- ARGV[4]  wake-up channel prefix
-- ARGV[5]  'PUBLISH' or 'SPUBLISH'
--
-- Returns 'status value' (scripts.py's one reply contract):
--   '1 p'  it had been notified. ARGV[2] = 1: the entry is deleted, and p = 1 if the
--          notification went to another waiter (0: nobody else waits). ARGV[2] = 0: the
--          entry is kept, p = 0
--   '0 0'  it was still waiting: the entry is deleted, nothing else changed
--   '-1 0' gone already (its lease had ended); nothing changed but the pruning of
--          dead entries every cond_* script does first
local entry = ARGV[1]
local pass_on = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local prefix = ARGV[4]
local publish = ARGV[5]

local now = pruned(prefix, publish)
if redis.call('ZREM', KEYS[1], entry) == 1 then
    redis.call('ZREM', KEYS[2], entry)
    return answer(0, 0)
end
if pass_on == 0 then
    if redis.call('ZSCORE', KEYS[2], entry) then
        redis.call('ZADD', KEYS[2], now + lease_ms, entry)
        keep_alive(KEYS[1], KEYS[2])
        return answer(1, 0)
    end
elseif redis.call('ZREM', KEYS[2], entry) == 1 then
    return answer(1, notify(KEYS[1], 1, prefix, publish))
end
return answer(-1, 0)
