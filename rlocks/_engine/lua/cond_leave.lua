-- cond_leave: a waiter stops waiting (time-out, or an error while waiting): its entry
-- leaves the condition, and says whether it had been notified meanwhile.
--
-- KEYS[1]  the queue (see cond_lib.lua)
-- KEYS[2]  the leases
-- ARGV[1]  entry id
-- ARGV[2]  1 = pass a notification the entry had on to the oldest live waiter (the
--          leaver is unwinding an error and will not act on it); 0 = the leaver takes it
-- ARGV[3]  wake-up channel prefix
-- ARGV[4]  'PUBLISH' or 'SPUBLISH'
--
-- Returns 'status value' (scripts.py's one reply contract):
--   '1 p'  it had been notified: the entry is deleted; p = 1 if the notification was
--          passed on to another waiter, 0 if it was kept (or nobody else waits)
--   '0 0'  it was still waiting: the entry is deleted, nothing else changed
--   '-1 0' gone already (its lease had ended); nothing changed but the pruning of
--          dead entries every cond_* script does first
local entry = ARGV[1]
local pass_on = tonumber(ARGV[2])
local prefix = ARGV[3]
local publish = ARGV[4]

pruned(prefix, publish)
if redis.call('ZREM', KEYS[1], entry) == 1 then
    redis.call('ZREM', KEYS[2], entry)
    return answer(0, 0)
end
if redis.call('ZREM', KEYS[2], entry) == 1 then
    local passed = 0
    if pass_on == 1 then
        passed = notify(KEYS[1], 1, prefix, publish)
    end
    return answer(1, passed)
end
return answer(-1, 0)
