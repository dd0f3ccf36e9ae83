-- barrier_lib: what a Barrier's scripts share (after lib.lua).
-- KEYS[1] H the barrier, HASH:
--           'parties'   how many parties pass together (every process must agree)
--           'gen'       the generation now filling (restarts at 0 when H goes)
--           'n'         parties arrived in it
--           'broken'    '1' while broken (absent otherwise)
--           'act'       the owner running the action of the full generation (absent
--                       otherwise): nobody passes or arrives until it is done
--           'a:<owner>' a party: '<state> <gen> <index> <call> <lease ms>', state
--                       'w' waiting, 'a' running the action, 'q' came while an action
--                       ran (it arrives when that ends; not counted), 'p' passed, 'b'
--                       broken (its outcome, not collected yet), 'c' / 'd' passed /
--                       broken and collected (kept until its lease ends or it arrives
--                       again, so a re-sent call after a lost reply finds its answer);
--                       <call> names the wait, so a re-send is told from a new arrival
-- KEYS[2] L the parties' leases, ZSET: owner -> lease end (server ms). A waiting party
--         renews its lease at each look; one that stops (its process died) is found by
--         the next script any party sends (tidy), and breaks the barrier if it was
--         waiting or running the action. An outcome's lease is the party's lease from
--         when it was given, and ends the field.
-- ARGV[1] owner (the caller), ARGV[2] wake prefix, ARGV[3] parties,
-- ARGV[4] keep, ms: how long H and L live after the last change while a generation
--         fills or the barrier is broken (so a party that died waiting still breaks it
--         for the next to come); an idle barrier's keys end with the last outcome's
--         lease, or go at once when none is left.

local H, L = KEYS[1], KEYS[2]
local ME = ARGV[1]
local PARTIES = tonumber(ARGV[3])
local KEEP = tonumber(ARGV[4])
-- An outcome not collected yet is kept at least this long (ms), so a party stopped for
-- a while after its generation passed still hears that it passed (not "broken").
local OUTCOME_MS = 60000

local function parse(v)
    local s, g, i, c, l = string.match(v, '^(%a) (%-?%d+) (%-?%d+) (%S+) (%d+)$')
    return s, tonumber(g), tonumber(i), c, tonumber(l)
end

local function record(owner, s, g, i, c, l)
    redis.call('HSET', H, 'a:' .. owner, string.format('%s %d %d %s %d', s, g, i, c, l))
end

-- The parties recorded in H: {owner, s, g, i, c, l} each.
local function parties()
    local all = redis.call('HGETALL', H)
    local out = {}
    for k = 1, #all, 2 do
        if string.sub(all[k], 1, 2) == 'a:' then
            local s, g, i, c, l = parse(all[k + 1])
            out[#out + 1] = {owner = string.sub(all[k], 3), s = s, g = g, i = i, c = c, l = l}
        end
    end
    return out
end

-- H's parties count if it differs from the caller's (nil: the same, or no barrier yet).
local function mismatch()
    local p = redis.call('HGET', H, 'parties')
    if p and tonumber(p) ~= PARTIES then return tonumber(p) end
    return nil
end

-- Give every waiting party (and the action's runner) the outcome `to` ('p' / 'b'), with
-- a fresh lease to collect it in (at least OUTCOME_MS), and hint them and the queued
-- ones (not the caller).
local function conclude(to)
    local hinted = {}
    for _, p in ipairs(parties()) do
        if p.s == 'w' or p.s == 'a' then
            record(p.owner, to, p.g, p.i, p.c, p.l)
            redis.call('ZADD', L, now_ms() + math.max(p.l, OUTCOME_MS), p.owner)
        end
        if (p.s == 'w' or p.s == 'a' or p.s == 'q') and p.owner ~= ME then
            hinted[#hinted + 1] = '0:b:' .. p.owner
        end
    end
    redis.call('HDEL', H, 'act')
    wake(ARGV[2], H, hinted)
end

-- Whether every party recorded has collected its outcome (or none is recorded).
local function all_collected()
    for _, p in ipairs(parties()) do
        if p.s ~= 'c' and p.s ~= 'd' then return false end
    end
    return true
end

-- The caller collects its outcome ('p' -> 'c', 'b' -> 'd'): kept for its own lease
-- only (a re-send's answer), no longer for OUTCOME_MS.
local function collect()
    local v = redis.call('HGET', H, 'a:' .. ME)
    if not v then return end
    local s, g, i, c, l = parse(v)
    if s == 'p' or s == 'b' then
        record(ME, s == 'p' and 'c' or 'd', g, i, c, l)
        redis.call('ZADD', L, now_ms() + l, ME)
    end
end

local function break_all()
    conclude('b')
    redis.call('HSET', H, 'broken', '1')
    collect()  -- the caller's own outcome is its reply
end

-- The full generation passes: its parties' outcomes are 'p', the next one starts.
local function pass()
    conclude('p')
    redis.call('HINCRBY', H, 'gen', 1)
    redis.call('HSET', H, 'n', 0)
end

-- Drop the parties whose lease ended (never the caller's: it is here); one that was
-- waiting or running the action breaks the barrier. Returns whether H changed.
local function tidy()
    local gone = redis.call('ZRANGEBYSCORE', L, '-inf', now_ms())
    local changed, dead = false, false
    for _, owner in ipairs(gone) do
        if owner ~= ME then
            local v = redis.call('HGET', H, 'a:' .. owner)
            if v then
                local s = parse(v)
                if s == 'w' or s == 'a' then dead = true end
                redis.call('HDEL', H, 'a:' .. owner)
            end
            redis.call('ZREM', L, owner)
            changed = true
        end
    end
    if dead and redis.call('HGET', H, 'broken') ~= '1' then break_all() end
    return changed
end

-- H and L's lifetime after a change (see ARGV[4]). `busy`: whether a generation fills,
-- an action runs or the barrier is broken, when the caller knows (nil: looked up).
local function settle(busy)
    if busy == nil then
        busy = tonumber(redis.call('HGET', H, 'n') or '0') > 0
            or redis.call('HEXISTS', H, 'act') == 1
            or redis.call('HGET', H, 'broken') == '1'
    end
    if busy then
        redis.call('PEXPIRE', H, KEEP)
        redis.call('PEXPIRE', L, KEEP)
        return
    end
    local last = redis.call('ZRANGE', L, -1, -1, 'WITHSCORES')
    if #last == 0 then
        redis.call('DEL', H, L)
        return
    end
    local ms = math.max(1, tonumber(last[2]) - now_ms())
    redis.call('PEXPIRE', H, ms)
    redis.call('PEXPIRE', L, ms)
end
