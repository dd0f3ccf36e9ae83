-- sem_acquire: take one permit of a (Bounded)Semaphore for one owner.
--
-- KEYS[1]  B;  KEYS[2]  Q;  KEYS[3]  L (sem_lib.lua)
-- ARGV[1]  owner id;  ARGV[2]  wake channel prefix (unused)
-- ARGV[3]  initial value;  ARGV[4]  1 bounded / 0 not
-- ARGV[5]  ttl, ms: the owner's lease on all its permits (never shortened)
-- ARGV[6]  permits the caller believes the owner holds before this call
-- ARGV[7]  fair '1' / '0';  ARGV[8]  entry lease, ms (0 = just try);  ARGV[9]  patience, ms
--
-- Replies:
--   '1 <permits> 0'  granted; permits = the owner's now
--   '2 <permits> 0'  this very call had been applied already (a re-send): nothing changed
--   '0 <ms>'         not granted; ask again within ms (queued when ARGV[8] > 0)
--   '-1'             the owner's earlier permits are gone (lease ended): nothing taken
--   '-4 <value> <bounded>'  Redis holds this name as a semaphore of another value or kind
local B, Q, L = KEYS[1], KEYS[2], KEYS[3]
local owner, value, bounded = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, expect = tonumber(ARGV[5]), tonumber(ARGV[6])
local fair, entry_ms = ARGV[7] == '1', tonumber(ARGV[8])

local function grant(count)
    redis.call('HSET', B, owner, count + 1, '#i', value, '#b', bounded, '#t', ttl)
    redis.call('HSETNX', B, '#v', value)
    redis.call('HINCRBY', B, '#h', 1)
    lease(owner, ttl)
    return reply('1', count + 1, 0)
end

if redis.call('EXISTS', B, Q) == 0 then
    if expect ~= 0 then return reply('-1') end
    if value < 1 then
        if entry_ms > 0 then enqueue(Q, new_member('p', owner), entry_ms) end
        return reply('0', entry_ms > 0 and entry_ms or 1000)
    end
    return grant(0)
end
local bad = mismatch(value, bounded)
if bad then return bad end
purge()
local count = tonumber(redis.call('HGET', B, owner) or '0')
if count ~= expect then
    if count == expect + 1 then return reply('2', count, 0) end
    return reply('-1')
end

local list, mine = waiters(Q, owner)
local n = free(value)
local ok = n >= 1 and not fair and patience_running(Q)
if n >= 1 and not ok then
    -- First come, first served: the caller is among the first n waiters (a caller not
    -- queued yet comes after every queued one).
    local place = #list + 1
    for i, m in ipairs(list) do
        if m == mine then place = i; break end
    end
    ok = place <= n
end
if ok then
    if mine ~= nil then served(Q, mine, #list - 1) end
    return grant(count)
end
local retry
if n < 1 then
    local first = redis.call('ZRANGE', L, 0, 0, 'WITHSCORES')
    retry = first[2] and (tonumber(first[2]) - now_ms()) or entry_ms
else
    retry = tonumber(redis.call('ZSCORE', Q, list[1])) - now_ms()
end
if entry_ms > 0 then
    enqueue(Q, mine or new_member('p', owner), entry_ms)
end
return reply('0', ask_again(Q, fair, retry))
