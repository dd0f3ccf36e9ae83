-- sem_lib: what a (Bounded)Semaphore's scripts share (after lib.lua).
-- KEYS[1] B holds hash: <owner> -> permits it holds; '#i' the initial value, '#b' 1 for
--         a BoundedSemaphore, '#v' the value (initial, grown by releases of nobody's
--         permit of an unbounded one), '#h' permits held by live owners
-- KEYS[2] Q queue (members' side 'p')
-- KEYS[3] L holder leases, ZSET: owner -> lease end (server ms)
-- A semaphore at rest (nothing held, value as initial) has no key; while its value is not
-- the initial one B and L never expire, else they expire at the last lease end.

local function stored(field)
    return tonumber(redis.call('HGET', KEYS[1], field) or '-1')
end

-- '-4 <value> <bounded>' if B holds a semaphore of another value or kind, else nil.
local function mismatch(value, bounded)
    local i = stored('#i')
    if i >= 0 and (i ~= value or stored('#b') ~= bounded) then
        return reply('-4', i, stored('#b'))
    end
    return nil
end

-- Drop owners whose lease ended: their permits are free again.
local function purge()
    local B, L = KEYS[1], KEYS[3]
    local gone = redis.call('ZRANGEBYSCORE', L, '-inf', now_ms())
    if #gone == 0 then return end
    for _, o in ipairs(gone) do
        local n = tonumber(redis.call('HGET', B, o) or '0')
        redis.call('HDEL', B, o)
        redis.call('HINCRBY', B, '#h', -n)
    end
    redis.call('ZREMRANGEBYSCORE', L, '-inf', now_ms())
end

local function free(value)
    local v = stored('#v')
    if v < 0 then v = value end
    return v - math.max(0, stored('#h'))
end

-- After a change: a semaphore at rest leaves no key; else B and L expire together.
local function settle(ttl)
    local B, L = KEYS[1], KEYS[3]
    local v, i, h = stored('#v'), stored('#i'), stored('#h')
    if h <= 0 and v == i then
        redis.call('DEL', B, L)
    elseif v ~= i then
        redis.call('PERSIST', B)
        redis.call('PERSIST', L)
    elseif ttl ~= nil then
        extend_key(B, ttl)
        extend_key(L, ttl)
    end
end

-- The waiters that can be served now: the first as many as permits are free.
local function servable(list)
    purge()
    local out, n = {}, free(tonumber(ARGV[3]) or 0)
    for _, m in ipairs(list) do
        if n <= 0 then break end
        out[#out + 1] = m
        n = n - 1
    end
    return out
end

-- A lease of ttl ms for owner's permits (never shortened).
local function lease(owner, ttl)
    local L = KEYS[3]
    local ends = now_ms() + ttl
    local cur = tonumber(redis.call('ZSCORE', L, owner) or '0')
    if ends > cur then redis.call('ZADD', L, ends, owner) end
    settle(ttl)
end
