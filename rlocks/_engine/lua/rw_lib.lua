-- rw_lib: what an RWLock's scripts share (after lib.lua).
-- KEYS[1] B holds hash: 'w:<owner>' / 'r:<owner>' -> count, '#w' -> the writing owner,
--         '#r' -> number of reading owners, '#t' -> the lease length of the last grant (ms)
-- KEYS[2] Q queue (members' side 'w' or 'r')
-- KEYS[3] L holder leases, ZSET: B field -> lease end (server ms); B and L expire together
--         at the last lease end

-- Whether B holds nobody: no field but '#t' (the lease length the last grant gave, ms,
-- which `rlocks inspect` reads to tell how long ago a holder renewed).
local function empty(B)
    local n = redis.call('HLEN', B)
    return n == 0 or (n == 1 and redis.call('HEXISTS', B, '#t') == 1)
end

-- Drop holds whose lease ended.
local function purge()
    local B, L = KEYS[1], KEYS[3]
    local gone = redis.call('ZRANGEBYSCORE', L, '-inf', now_ms())
    if #gone == 0 then return end
    for _, f in ipairs(gone) do
        if redis.call('HDEL', B, f) == 1 then
            if string.sub(f, 1, 1) == 'w' then
                redis.call('HDEL', B, '#w')
            elseif redis.call('HINCRBY', B, '#r', -1) <= 0 then
                redis.call('HDEL', B, '#r')
            end
        end
    end
    redis.call('ZREMRANGEBYSCORE', L, '-inf', now_ms())
    if empty(B) then redis.call('DEL', B, L) end
end

local function writer()
    return redis.call('HGET', KEYS[1], '#w')
end

local function readers()
    return tonumber(redis.call('HGET', KEYS[1], '#r') or '0')
end

-- The waiters (in arrival order) that can be served now: a writer at the head when
-- nothing is held; the readers before the first queued writer while no writer holds.
local function servable(list)
    purge()
    if #list == 0 or writer() then return {} end
    if side_of(list[1]) == 'w' then
        if readers() == 0 then return {list[1]} end
        return {}
    end
    local out = {}
    for _, m in ipairs(list) do
        if side_of(m) ~= 'r' then break end
        out[#out + 1] = m
    end
    return out
end

-- A lease of ttl ms for field f (never shortened); B and L live to the last lease end.
local function lease(f, ttl)
    local B, L = KEYS[1], KEYS[3]
    local ends = now_ms() + ttl
    local cur = tonumber(redis.call('ZSCORE', L, f) or '0')
    if ends > cur then redis.call('ZADD', L, ends, f) end
    extend_key(B, ttl)
    extend_key(L, ttl)
end
