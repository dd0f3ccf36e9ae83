-- event_set: set the Event, and tell every live waiter (mark its entry, hint its
-- process). A second send finds it set and changes nothing.
-- KEYS[1] H, KEYS[2] Q (event_lib.lua);  ARGV[1] wake channel prefix
-- Replies: '1 <n>' it was clear and is set now, n waiters told;
--          '2' it was set already (nothing changed, nobody told).
if is_set() then return reply('2') end
redis.call('HSET', H, 'set', '1')
if redis.call('EXISTS', Q) == 0 then return reply('1', 0) end  -- nobody waits: done
prune()
local flat = redis.call('ZRANGE', Q, 0, -1, 'WITHSCORES')
local n = 0
for i = 1, #flat, 2 do
    local member = flat[i]
    if string.sub(member, 1, 1) ~= '!' then  -- (a marked one was told by an earlier set)
        redis.call('ZREM', Q, member)
        redis.call('ZADD', Q, flat[i + 1], '!' .. member)  -- same lease end
        hint(ARGV[1], member)
        n = n + 1
    end
end
return reply('1', n)
