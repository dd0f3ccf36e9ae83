-- rlock_release: give back holds of an exclusive reentrant lock.
--
-- KEYS[1]  the lock's hash: field = owner id, value = hold count
-- KEYS[2]  the lock's wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  holds to give back, count (>= 1)
-- ARGV[3]  1 = give back every hold of this owner, whatever ARGV[2] says
--          (_release_save(), so a Condition really lets go); 0 = give back ARGV[2] holds
-- ARGV[4]  publish command: 'PUBLISH' or 'SPUBLISH' (chosen by the engine, never user input)
--
-- Returns {status, value}:
--   {  1, count }  released; count = the owner's holds left. At 0 the hash is deleted and
--                  one wake-up ("1": wake one waiter) is published on KEYS[2].
--   { -1, 0 }      this owner holds nothing here (lease expired, key deleted, or taken
--                  over): nothing was changed.
local owner = ARGV[1]
local drop = tonumber(ARGV[2])
local drop_all = tonumber(ARGV[3])

local count = redis.call('HGET', KEYS[1], owner)
if not count then
    return {-1, 0}
end
count = tonumber(count) - drop
if count > 0 and drop_all == 0 then
    redis.call('HSET', KEYS[1], owner, count)
    return {1, count}
end
redis.call('DEL', KEYS[1])
if ARGV[4] == 'SPUBLISH' then
    redis.call('SPUBLISH', KEYS[2], '1')
else
    redis.call('PUBLISH', KEYS[2], '1')
end
return {1, 0}
