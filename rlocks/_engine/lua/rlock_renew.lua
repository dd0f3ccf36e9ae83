-- rlock_renew: extend the lease of a hold, if the owner still has it.
--
-- KEYS[1]  the lock's hash: field = owner id, value = hold count
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms (> 0): the hash's PEXPIRE becomes at least this (never shortened:
--          another object of the same owner, or an extend, may have set a longer lease)
--
-- Returns {status, value}:
--   {  1, count }  renewed; count = the owner's hold count
--   { -1, 0 }      this owner holds nothing here: the hold is lost, nothing was changed
local owner = ARGV[1]
local lease_ms = tonumber(ARGV[2])

local count = redis.call('HGET', KEYS[1], owner)
if not count then
    return {-1, 0}
end
if redis.call('PTTL', KEYS[1]) < lease_ms then
    redis.call('PEXPIRE', KEYS[1], lease_ms)
end
return {1, tonumber(count)}
