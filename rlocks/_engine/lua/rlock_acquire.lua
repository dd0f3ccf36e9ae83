-- rlock_acquire: take or re-enter an RLock for one owner (a thread or task).
--
-- KEYS[1]  B  holds hash: <owner> -> count, and '#t' the lease length a grant gave (ms,
--             for `rlocks inspect`: how long ago the holder renewed); its PEXPIRE is the lease
-- KEYS[2]  Q  waiting queue (lib.lua)
-- KEYS[3]  F  fencing token counter of the slot
-- ARGV[1]  owner id
-- ARGV[2]  ttl, ms: the lease this grant gives (a live lease is never shortened)
-- ARGV[3]  count the caller believes the owner holds before this call (0: a fresh hold)
-- ARGV[4]  fair: '1' first come, first served; '0' a free lock goes to whoever asks
--          while a woken head's patience runs
-- ARGV[5]  entry lease, ms: queue the owner if not granted; 0 = just try
-- ARGV[6]  wake channel prefix
-- ARGV[7]  patience, ms (fair = '0')
--
-- Replies (lib.lua's reply: a line, then the owners woken):
--   '1 <count> <token>'  granted; count = the owner's holds now; token = the fencing
--                        token of a fresh hold, 0 for a re-entry (it keeps its token)
--   '2 <count> <token>'  this very call had been applied already (a re-send after a lost
--                        reply): nothing changed, but a fresh hold gets a new token
--   '0 <ms>'             not granted; ask again within ms (queued when ARGV[5] > 0)
--   '-1'                 the owner's hold is gone (a re-entry of a lost hold)
local B, Q, F = KEYS[1], KEYS[2], KEYS[3]
local owner, ttl, expect = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fair, entry_ms = ARGV[4] == '1', tonumber(ARGV[5])

-- The uncontended path: nobody holds, nobody waits.
if redis.call('EXISTS', B, Q) == 0 then
    if expect ~= 0 then return reply('-1') end
    local t = token(F)
    redis.call('HSET', B, owner, 1, '#t', ttl)
    redis.call('PEXPIRE', B, ttl)
    return reply('1 1', t)
end

local count = tonumber(redis.call('HGET', B, owner) or '0')
if count > 0 or expect > 0 then
    if count == expect then
        redis.call('HINCRBY', B, owner, 1)
        extend_key(B, ttl)
        return reply('1', count + 1, 0)
    end
    if count == expect + 1 then
        if count == 1 then return reply('2 1', token(F)) end
        return reply('2', count, 0)
    end
    return reply('-1')
end

-- A fresh acquire on a held lock, or on a free one with waiters.
local list, mine = waiters(Q, owner)
local held = redis.call('EXISTS', B) == 1
if not held then
    local head = list[1]
    if head == nil or head == mine or (not fair and patience_running(Q)) then
        if mine ~= nil then served(Q, mine, #list - 1) end
        local t = token(F)
        redis.call('HSET', B, owner, 1, '#t', ttl)
        redis.call('PEXPIRE', B, ttl)
        return reply('1 1', t)
    end
end
local retry
if held then
    retry = redis.call('PTTL', B)
else
    -- Free, but kept for the head: it was woken (or is dead and drops out then).
    retry = tonumber(redis.call('ZSCORE', Q, list[1])) - now_ms()
end
if entry_ms > 0 then
    enqueue(Q, mine or new_member('x', owner), entry_ms)
end
return reply('0', ask_again(Q, fair, retry))
