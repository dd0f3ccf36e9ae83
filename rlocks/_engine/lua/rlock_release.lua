-- rlock_release: give back one level of an owner's RLock hold.
--
-- KEYS[1]  B  holds hash;  KEYS[2]  Q  waiting queue
-- ARGV[1]  owner id
-- ARGV[2]  count the caller believes the owner holds before this call (>= 1)
-- ARGV[3]  fair: '1' / '0';  ARGV[4]  wake channel prefix;  ARGV[5]  patience, ms
--
-- Replies:
--   '1 <count>'  released; count = the owner's holds left (0: the lock is free, and the
--                head waiter was woken)
--   '2 <count>'  this very call had been applied already (a re-send): nothing changed
--   '-1'         the owner holds nothing: its hold was lost (or, for a re-send of the
--                last level, released by the first send: the caller knows which)
local B, Q = KEYS[1], KEYS[2]
local owner, expect = ARGV[1], tonumber(ARGV[2])
local count = tonumber(redis.call('HGET', B, owner) or '0')
if count == 0 then return reply('-1') end
if count == expect - 1 then return reply('2', count) end
if count ~= expect then return reply('-1') end
if count > 1 then
    redis.call('HINCRBY', B, owner, -1)
    return reply('1', count - 1)
end
redis.call('DEL', B)
if redis.call('EXISTS', Q) == 1 then
    local list = waiters(Q, nil)
    wake_heads(ARGV[4], B, Q, servable(list), ARGV[3] == '1', tonumber(ARGV[5]))
end
return reply('1 0')
