-- rw_release: give back one level of an owner's hold of one RWLock side.
--
-- KEYS[1]  B;  KEYS[2]  Q;  KEYS[3]  L (rw_lib.lua)
-- ARGV[1]  owner id;  ARGV[2]  side 'r' / 'w'
-- ARGV[3]  count the caller believes the owner holds on that side (>= 1)
-- ARGV[4]  fair '1' / '0';  ARGV[5]  wake channel prefix;  ARGV[6]  patience, ms
--
-- Replies: as rlock_release.lua ('1 <count>', '2 <count>', '-1').
local B, Q, L = KEYS[1], KEYS[2], KEYS[3]
local owner, side, expect = ARGV[1], ARGV[2], tonumber(ARGV[3])
local field = side .. ':' .. owner
purge()
local count = tonumber(redis.call('HGET', B, field) or '0')
if count == 0 then return reply('-1') end
if count == expect - 1 then return reply('2', count) end
if count ~= expect then return reply('-1') end
if count > 1 then
    redis.call('HINCRBY', B, field, -1)
    return reply('1', count - 1)
end
redis.call('HDEL', B, field)
redis.call('ZREM', L, field)
if side == 'w' then
    redis.call('HDEL', B, '#w')
elseif redis.call('HINCRBY', B, '#r', -1) <= 0 then
    redis.call('HDEL', B, '#r')
end
if empty(B) then redis.call('DEL', B, L) end
if redis.call('EXISTS', Q) == 1 then
    wake_heads(ARGV[5], B, Q, servable(waiters(Q, nil)), ARGV[4] == '1', tonumber(ARGV[6]))
end
return reply('1 0')
