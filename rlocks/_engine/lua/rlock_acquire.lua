-- rlock_acquire: take, or re-enter, an exclusive reentrant hold.
--
-- KEYS[1]  the lock's hash: field = owner id, value = hold count (one field at most)
-- ARGV[1]  owner id (opaque string)
-- ARGV[2]  lease, ms (> 0): the hash's PEXPIRE after a grant
-- ARGV[3]  holds to add, count (>= 1): 1 for acquire(), n for _acquire_restore()
--
-- Returns {status, value}:
--   { 1, count }  granted; count = the owner's hold count now
--   { 0, ms }     held by another owner; ms = that hold's remaining lease
--                 (-1 if the key has no expiry: never left behind by rlocks)
local owner = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local add = tonumber(ARGV[3])

if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], owner) == 1 then
    local count = redis.call('HINCRBY', KEYS[1], owner, add)
    redis.call('PEXPIRE', KEYS[1], lease_ms)
    return {1, count}
end
return {0, redis.call('PTTL', KEYS[1])}
