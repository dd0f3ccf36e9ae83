-- rlock_acquire: take, or re-enter, an exclusive reentrant hold.
--
-- KEYS[1]  the lock's hash: field = owner id, value = hold count (one field at most)
-- ARGV[1]  owner id (opaque string)
-- ARGV[2]  lease, ms (> 0): the hash's PEXPIRE after a grant, unless it has longer left
--          (never shortened: another object of the same name, with a longer ttl, may
--          hold outer levels of this owner's hold and renew it less often)
-- ARGV[3]  holds to add, count (>= 1): 1 for acquire(), n for _acquire_restore()
-- ARGV[4]  1 = the caller believes this owner already holds the lock (re-entry); 0 = not
--
-- Returns {status, value}:
--   { 1, count }  granted; count = the owner's hold count now
--   { 0, ms }     held by another owner; ms = that hold's remaining lease
--                 (-1 if the key has no expiry: never left behind by rlocks)
--   {-1, 0 }      re-entry refused: the owner believed it held the lock but its hold is
--                 gone (lease ended unnoticed, key deleted); nothing was changed
local owner = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local add = tonumber(ARGV[3])
local reentry = tonumber(ARGV[4])

-- Granting a "re-entry" as a fresh hold would let the owner's later releases free a lock
-- it still believes it holds in an outer frame.
if reentry == 1 and redis.call('HEXISTS', KEYS[1], owner) == 0 then
    return {-1, 0}
end

if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], owner) == 1 then
    local count = redis.call('HINCRBY', KEYS[1], owner, add)
    -- Compared here, not PEXPIRE ... GT, which needs Redis 7 (PTTL -1: no expiry yet).
    if redis.call('PTTL', KEYS[1]) < lease_ms then
        redis.call('PEXPIRE', KEYS[1], lease_ms)
    end
    return {1, count}
end
return {0, redis.call('PTTL', KEYS[1])}
