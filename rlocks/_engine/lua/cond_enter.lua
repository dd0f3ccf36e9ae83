-- cond_enter: a waiter joins the condition's queue (called while it holds the lock, so no
-- notification issued after it lets the lock go can miss it).
--
-- KEYS[1]  the queue (see cond_lib.lua)
-- KEYS[2]  the leases
-- ARGV[1]  entry id, "<owner>/<serial>" (new: never used before)
-- ARGV[2]  lease, ms (> 0): the entry is dropped if not renewed within it
-- ARGV[3]  wake-up channel prefix (the owner is appended)
-- ARGV[4]  'PUBLISH', or 'SPUBLISH' on Redis Cluster
--
-- Returns 'status value' (scripts.py's one reply contract):
--   '1 n'  queued; n = entries waiting now, this one included (it is the newest)
local entry, lease_ms, prefix, publish = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local now = pruned(prefix, publish)
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local number = 1
if #newest > 0 then
    number = tonumber(newest[2]) + 1
end
redis.call('ZADD', KEYS[1], number, entry)
redis.call('ZADD', KEYS[2], now + lease_ms, entry)
keep_alive(KEYS[1], KEYS[2])
return answer(1, redis.call('ZCARD', KEYS[1]))
