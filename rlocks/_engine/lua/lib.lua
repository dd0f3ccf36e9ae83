-- lib: helpers every operation script starts with (scripts.py puts this text in front
-- of each file, so each operation is still one self-contained script). Nothing here runs
-- on its own, reads ARGV, or keeps state past the call.
--
-- The waiting queue Q of a primitive is a ZSET. A waiter's member is
--   '<arrival>:<side>:<owner>'
-- arrival = server microseconds when it first queued, zero-padded to 16 digits (so the
-- smallest member is the oldest waiter), side = 'x' (RLock), 'r'/'w' (RWLock read/write),
-- 'p' (a permit); its score is when its entry lease ends (server ms): a waiter that stops
-- asking drops out by itself. Members starting with '~' are the fair=False patience
-- marks (see patience below), never waiters.
--
-- Wake-ups are hints, never grants: a script that frees capacity publishes
-- '<primitive key>\n<owner>' on '<wake prefix><process>' for each waiter at the head that
-- the capacity could serve (<process> is the owner id without its last ':' part, so one
-- channel per process); the waiter then asks with its own acquire. Every reply ends with
-- the owners it woke, one per line, so a process can wake its own waiters at once.

local now_cache, us_cache

-- Server time: milliseconds and microseconds (one TIME per script).
local function now_ms()
    if now_cache == nil then
        local t = redis.call('TIME')
        us_cache = tonumber(t[1]) * 1000000 + tonumber(t[2])
        now_cache = math.floor(us_cache / 1000)
    end
    return now_cache
end

local function now_us()
    now_ms()
    return us_cache
end

-- A fresh fencing token from the counter F: larger than every token F gave before, and,
-- when F was missing (first use, or a restart that lost it), not below the server clock
-- in microseconds, so tokens still grow across such a loss.
local function token(F)
    local t = redis.call('INCR', F)
    if t == 1 then
        t = now_us()
        redis.call('SET', F, t)
    end
    return t
end

-- The key lives at least `ms` from now (a lease is never shortened).
local function extend_key(key, ms)
    if redis.call('PTTL', key) < ms then
        redis.call('PEXPIRE', key, ms)
    end
end

local function owner_of(member)
    return string.match(member, '^[^:]*:[^:]*:(.*)$')
end

local function side_of(member)
    return string.sub(member, 18, 18)
end

-- The live waiters of Q in arrival order, and the caller's member (nil if not queued).
-- Drops entries whose lease ended first.
local function waiters(Q, owner)
    redis.call('ZREMRANGEBYSCORE', Q, '-inf', now_ms())
    local all = redis.call('ZRANGE', Q, 0, -1)
    local list, mine = {}, nil
    for _, m in ipairs(all) do
        if string.sub(m, 1, 1) ~= '~' then
            list[#list + 1] = m
            if owner ~= nil and owner_of(m) == owner then mine = m end
        end
    end
    table.sort(list)
    return list, mine
end

local woken = {}

-- Hint the waiters `members` to try now.
local function wake(prefix, key, members)
    for _, m in ipairs(members) do
        local owner = owner_of(m)
        local process = string.match(owner, '^(.*):[^:]*$')
        redis.call('PUBLISH', prefix .. process, key .. '\n' .. owner)
        woken[#woken + 1] = owner
    end
end

-- The reply: one line of text, then the owners this call woke, one per line.
local function reply(...)
    local parts = {...}
    for i, v in ipairs(parts) do
        if type(v) == 'number' then parts[i] = string.format('%d', v) end
    end
    local line = table.concat(parts, ' ')
    if #woken > 0 then line = line .. '\n' .. table.concat(woken, '\n') end
    return line
end

-- Queue `member` (or renew its entry) for `entry_ms`; Q lives as long as its last entry.
local function enqueue(Q, member, entry_ms)
    redis.call('ZADD', Q, now_ms() + entry_ms, member)
    extend_key(Q, entry_ms)
end

local function new_member(side, owner)
    return string.format('%016d', now_us()) .. ':' .. side .. ':' .. owner
end

-- fair=False patience. When a release wakes the head waiter of an unfair primitive for
-- the first time, '~w:<head>' marks it woken (it drops out with the head's entry lease)
-- and '~p' lets anyone take the freed capacity for `patience` ms; once '~p' is gone the
-- head has it first. So a thread that re-acquires at once runs sections in a row for at
-- most the patience, and the woken head is served then.
local function patience_running(Q)
    return redis.call('ZSCORE', Q, '~p') ~= false
end

local function start_patience(Q, head, patience_ms)
    local mark = '~w:' .. head
    if redis.call('ZSCORE', Q, mark) == false then
        redis.call('ZADD', Q, redis.call('ZSCORE', Q, head), mark)
        redis.call('ZADD', Q, now_ms() + patience_ms, '~p')
    end
end

-- A release's wake-up of the heads it frees capacity for. For an unfair primitive (fair
-- false) the first such release starts the head's patience, and releases while it runs
-- wake nobody: the woken head asks again when it ends (its refusal told it when), so a
-- thread that runs sections in a row does not make the head ask in vain at each one.
local function wake_heads(prefix, B, Q, heads, fair, patience_ms)
    if not fair and patience_running(Q) then return end
    wake(prefix, B, heads)
    if not fair and #heads > 0 then start_patience(Q, heads[1], patience_ms) end
end

-- When a refused caller should ask again at the latest: within `retry` ms, and for an
-- unfair primitive by the end of a running patience (after which the head is served).
local function ask_again(Q, fair, retry)
    if not fair then
        local ends = redis.call('ZSCORE', Q, '~p')
        if ends ~= false then retry = math.min(retry, tonumber(ends) - now_ms()) end
    end
    return math.max(1, retry)
end

-- `member` was served (granted) or left: its entry and its woken mark go; Q goes when
-- `others` (the live waiters left) is 0.
local function served(Q, member, others)
    if others == 0 then
        redis.call('DEL', Q)
    else
        redis.call('ZREM', Q, member, '~w:' .. member)
    end
end
