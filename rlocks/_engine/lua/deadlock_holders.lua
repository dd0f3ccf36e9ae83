-- deadlock_holders: the live holds of one RLock or RWLock, and the queue entry just ahead
-- of a waiter's, for the deadlock detector (rlocks/_engine/deadlock.py). Read-only; run
-- only by a wait longer than its deadlock_timeout. (after lib.lua)
--
-- KEYS[1]  B  holds hash;  KEYS[2]  Q  queue;  KEYS[3]  L  holder leases (RWLock)
-- ARGV[1]  'rlock' or 'rw'
-- ARGV[2]  the waiter's owner id, '' = do not look at the queue (fair=False)
--
-- Returns {holds, ahead}:
--   holds  the fields of the holds that are live: an RLock's owners, an RWLock's
--          'r:<owner>' / 'w:<owner>' whose lease has not ended
--   ahead  {owner, side, its arrival, the waiter's arrival} of the live entry just ahead
--          of the waiter's in the queue, or {} (not queued, at the head, or not asked).
--          An entry keeps its arrival while it keeps its place.
local B, Q, L = KEYS[1], KEYS[2], KEYS[3]
local holds = {}
if ARGV[1] == 'rlock' then
    for _, f in ipairs(redis.call('HKEYS', B)) do
        if string.sub(f, 1, 1) ~= '#' then holds[#holds + 1] = f end
    end
else
    holds = redis.call('ZRANGEBYSCORE', L, '(' .. now_ms(), '+inf')
end
local ahead = {}
if ARGV[2] ~= '' then
    local live = {}
    local all = redis.call('ZRANGE', Q, 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
        if string.sub(all[i], 1, 1) ~= '~' and tonumber(all[i + 1]) > now_ms() then
            live[#live + 1] = all[i]
        end
    end
    table.sort(live)
    for i, m in ipairs(live) do
        if owner_of(m) == ARGV[2] then
            if i > 1 then
                local prev = live[i - 1]
                ahead = {owner_of(prev), side_of(prev), string.sub(prev, 1, 16),
                         string.sub(m, 1, 16)}
            end
            break
        end
    end
end
return {holds, ahead}
