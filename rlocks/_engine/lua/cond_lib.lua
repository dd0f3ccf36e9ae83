-- cond_lib: what a Condition's scripts share (after lib.lua).
-- KEYS[1] C the condition's waiters, ZSET: member '<arrival>:c:<owner>' while it waits,
--         '!<arrival>:c:<owner>' once notified; score = when its lease ends (server ms).
--         A waiter renews its lease each time it looks (cond_check), so a dead waiter's
--         entry ends by itself, and a notification it had goes on to the next waiter.
-- ARGV[1] owner id (of the caller), ARGV[2] wake channel prefix

local C = KEYS[1]

-- The un-notified waiters' members in arrival order.
local function waiting()
    local out = {}
    for _, m in ipairs(redis.call('ZRANGE', C, 0, -1)) do
        if string.sub(m, 1, 1) ~= '!' then out[#out + 1] = m end
    end
    table.sort(out)
    return out
end

-- Notify the n oldest waiting entries (n = nil: all); returns how many were.
local function notify(n)
    local chosen = {}
    for _, m in ipairs(waiting()) do
        if n ~= nil and #chosen >= n then break end
        local score = redis.call('ZSCORE', C, m)
        redis.call('ZREM', C, m)
        redis.call('ZADD', C, score, '!' .. m)
        chosen[#chosen + 1] = m
    end
    wake(ARGV[2], C, chosen)
    return #chosen
end

-- Drop entries whose lease ended; a notification an ended entry had goes to the next.
local function tidy()
    local gone = redis.call('ZRANGEBYSCORE', C, '-inf', now_ms())
    if #gone == 0 then return end
    local lost = 0
    for _, m in ipairs(gone) do
        if string.sub(m, 1, 1) == '!' then lost = lost + 1 end
    end
    redis.call('ZREMRANGEBYSCORE', C, '-inf', now_ms())
    if lost > 0 then notify(lost) end
end

-- The caller's entry and whether it was notified (nil: it has none).
local function mine()
    local suffix = ':c:' .. ARGV[1]
    for _, m in ipairs(redis.call('ZRANGE', C, 0, -1)) do
        if string.sub(m, -#suffix) == suffix then
            return m, string.sub(m, 1, 1) == '!'
        end
    end
    return nil, false
end
