-- queue_lib: the server-side FIFO queue and hand-over shared by every script in this
-- folder. The loader (scripts.py) puts this file and op_lib.lua in front of each operation
-- file (rlock_*, rw_*, sem_*, force_release), so every operation still runs as one script:
-- a Redis Functions library whose functions run the operation files (Redis 7.0+), or one
-- EVAL script per operation; on its own it does nothing.
-- docs/design/handover.md explains the design; this header is the contract.
--
-- KEYS (the same seven, in this order, for every script; all in one cluster slot):
--   KEYS[1]  H  holds hash. rlock: <owner> -> count. rw: r:<owner> / w:<owner> -> count,
--              '#w' -> the writing owner, '#nr' -> number of reading owners.
--              sem: <owner> (a thread or task) -> permits, '#free', '#value', '#bounded',
--              '#held' (permits held by live holders). Owner ids never start with '#'.
--   KEYS[2]  L  holder lease ends, ZSET: member = H field of the hold, score = end (ms)
--   KEYS[3]  Q  the queue, ZSET: member = entry id (a process's wake-up hub: '<process token>/<n>'), score = sequence
--   KEYS[4]  W  entries hash: 'e:<entry>' -> JSON {w = waiter, o = owner, s = side,
--              n = holds wanted, k = 1 once woken without a grant (fair = 0),
--              b = 1: its lines go to the list 'C:E' instead of the channel,
--              p = server ms when its patience ends (fair = 0, set when woken),
--              l = the entry lease (ms) of the call that queued it: a grant to it lives
--              that long until adopted, whoever's call makes the grant, but never
--              past the end the entry had (its score in T),
--              t = when the entry took its place (server ms; for inspection only)};
--              'g:<waiter>' -> JSON {o, s, n, t}: a hand-over grant (t = its fencing
--              token as a string, '0' for a semaphore) the waiter has not
--              adopted yet; '#seq' -> last sequence number
--   KEYS[5]  T  entry lease ends, ZSET: 'e:<entry>' and 'g:<waiter>' -> end (ms)
--   KEYS[6]  the wake-up channel prefix C: the process of queue entry E listens on
--              'C:E' (shard channels on a cluster: C carries the hash tag), so a
--              hand-over wakes only the processes it names; or, while E's entry has
--              b = 1, reads them from the LIST of the same name 'C:E' (its waiting
--              thread BLPOPs it: no pub/sub hop, no thread switch). The list only ever
--              holds lines of E's current place in the queue: a call that gives E a new
--              place deletes it first
--   KEYS[7]  F  the fencing token counter, a hash: 'last' -> the last token issued to any
--              primitive of the namespace whose keys hash to this cluster slot (its own
--              hash tag is chosen to land there), so the number of such keys is bounded
--              (16,384 per namespace) whatever the number of names. No expiry.
--
-- Context ARGV (the first ARGV of every script):
--   ARGV[1]  now, server ms; '' = read redis TIME (production always sends ''; tests send
--            a value to drive lease expiry without sleeping)
--   ARGV[2]  publish command: 'PUBLISH' or 'SPUBLISH' (chosen by the engine)
--   ARGV[3]  fair: 1 = FIFO, no barging; 0 or -P = not fair: a free primitive goes to
--            whoever asks, a release wakes the head waiters ('w') and starts their
--            patience of P ms (0 = none); a woken waiter that lost the race is granted by
--            the first hand-over once its patience has ended (not woken again within it)
--   ARGV[4]  entry lease, ms (>= 1): lease of a queue entry this call makes or renews
--            (a hand-over grant lives its entry's 'l', at most to the entry's end,
--            until its owner adopts it)
--   sem only: ARGV[5] initial value, count (>= 0); ARGV[6] 1 = bounded, 0 = not
--
-- ONE reply shape for every script, one line of text and then the wake-up lines:
--   '<status> <value> <aux> <token>[ <items>]' ['\n' <wake> ...]
-- integers in decimal, items comma-joined: one element for the client to parse, where a
-- table is one per value (redis-py's own parser reads each at a cost). Inside the library
-- a reply is the table {status, value, aux, wakes[, items[, token]]}; reply_text turns it
-- into the text as the function returns.
--    1  OK        acquire: granted, value = the caller's holds now (on that side),
--                 aux = the hold's lease left (ms). release: value = holds left.
--                 leave: the entry was removed (value 0) or re-pointed (value = its
--                 position; 0 when the next waiter was granted at once, see wakes).
--                 renew: value = items renewed; items: each item's status.
--    2  ADOPTED   acquire: the caller's waiter had been handed the primitive (a wake-up
--                 it missed); adopted now, NOTHING added; value = holds, aux = lease ms
--    3  QUEUED    acquire: the caller's entry waits; value = its position (1 = head),
--                 aux = ms until the earliest holder lease ends (-1: no holder), or
--                 until the entry's patience ends if that is sooner (fair = 0): when
--                 to ask again
--    4  PASSED    leave: the waiter had been handed the primitive; those holds were given
--                 back and passed on; value = holds given back
--    0  BUSY      acquire with queue = 0: not granted, nothing queued; value = ms until
--                 the earliest holder lease ends (-1: none), aux = entries queued
--   -1  NOT_HELD  acquire re-entry refused (hold gone); release/leave: nothing held or
--                 queued for this owner. No hold changed; expired state was recovered
--                 (what it freed handed over, expiries reset) as by every call.
--   -2  UPGRADE   rw acquire of the write side by an owner that only reads: refused
--   -3  OVER      sem release that would lift a bounded semaphore above its value
--   wakes: the lines this call published, in queue order; each woken process's lines
--   go in one message on its channel 'C:E' (an entry with b = 1: one element RPUSHed to
--   the list 'C:E', which then expires with the entry lease), joined by '\n'. 'g <waiter> <token>' =
--   granted (the waiter now holds what its entry asked, with the short lease; token =
--   the grant's fencing token; a semaphore's line is 'g <waiter>'),
--   'w <waiter>' = woken to try again (fair = 0 only).
--   items: renew, each item's status (absent from a renew of no item); and a release
--   of rlock or rw that carried its process's next waiter's queueing (see
--   rlock_release.lua): that queueing's status, value, aux and token. Absent from
--   every other reply.
--   token: acquire replies 1 and 2 of rlock and rw when the caller's hold on that side
--   is new (a fresh grant, or the adopted hand-over grant): its fencing token; absent
--   (0 in the text) when the call issued none (re-entry keeps the caller's token).
--   Also renew replies with a 't' item whose hold exists: the token issued to it.
--   And QUEUED replies of rlock and rw: the last token issued so far (F), so that a
--   grant line whose token is above it was made after this call (0 when F is 0).
--
-- Fencing tokens (rlock and rw; a semaphore issues none): every fresh hold of a side
-- gets token = max(F + 1, server TIME in microseconds; ARGV[1] * 1000 when given) and F
-- becomes it. F orders grants through expiries, forced releases and hand-overs; after
-- a restart that lost F the clock does, so tokens still grow unless the server clock
-- stepped back (F only runs ahead of the clock by grants made within one microsecond).
--   Errors: 'RLOCKS_BAD_ARG <name>' (a malformed ARGV; nothing changed),
--   'RLOCKS_SEM_MISMATCH <value> <bounded>' (sem made with another value or kind).

-- Loaded two ways (scripts.py composes both from this same text): as the front of each
-- EVAL script, or once per server as a Redis Functions library whose functions run the
-- operation files. Either way nothing below reads KEYS or ARGV until bind() has set them
-- for the call, and no state outlives a call: bind() resets all of it.
local KEYS, ARGV
local H, L, Q, W, T, CHANNEL, F
local MAXINT = 9007199254740991

-- First malformed ARGV, as an error message; checked before anything is written.
local bad = nil

-- The call's KEYS and ARGV (the EVAL globals, or a function's two arguments).
local function bind(keys, argv)
    KEYS, ARGV = keys, argv
    H, L, Q, W, T, CHANNEL, F = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6], keys[7]
    bad = nil
end

local function int_arg(i, name, min, max)
    local v = tonumber(ARGV[i])
    if v == nil or v ~= v or v ~= math.floor(v) or v < (min or -MAXINT)
            or v > (max or MAXINT) then
        bad = bad or ('RLOCKS_BAD_ARG ' .. name)
        return 0
    end
    return v
end

local function str_arg(i, name, allow_empty)
    local v = ARGV[i]
    if v == nil or (v == '' and not allow_empty) or string.sub(v, 1, 1) == '#'
            or string.find(v, '[%s]') then
        bad = bad or ('RLOCKS_BAD_ARG ' .. name)
        return ''
    end
    return v
end

local function side_arg(i, name, kind, allow_empty)
    local v = ARGV[i]
    if allow_empty and v == '' then return v end
    local ok = (kind == 'rw' and (v == 'r' or v == 'w')) or (kind == 'rlock' and v == 'x')
        or (kind == 'sem' and v == 's')
    if not ok then bad = bad or ('RLOCKS_BAD_ARG ' .. name) end
    return v
end

local function fmt(n) return string.format('%d', n) end

-- The context: ARGV[1..4] (sem: ..6) and the primitive's O(1) counters. Returns ctx and
-- the index of the first operation ARGV.
local function context(kind)
    -- qdirty: the queue keys (Q, W, T) changed, so finish() must redo their expiry
    local ctx = {kind = kind, wakes = {}, pub = {}, pub_order = {}, listed = {}, qdirty = false,
                 granted = 0}
    if ARGV[1] == '' then
        local t = redis.call('TIME')
        ctx.now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        ctx.us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    else
        ctx.now = int_arg(1, 'now', 0)
        ctx.us = ctx.now * 1000
    end
    ctx.publish = ARGV[2]
    if ctx.publish ~= 'PUBLISH' and ctx.publish ~= 'SPUBLISH' then
        bad = bad or 'RLOCKS_BAD_ARG publish'
    end
    ctx.fair = int_arg(3, 'fair', -MAXINT, 1)
    ctx.patience = 0
    if ctx.fair < 0 then
        ctx.patience, ctx.fair = -ctx.fair, 0
    end
    ctx.elease = int_arg(4, 'entry_lease', 1)
    if kind == 'sem' then
        ctx.value = int_arg(5, 'value', 0)
        ctx.bounded = int_arg(6, 'bounded', 0, 1)
        return ctx, 7
    end
    return ctx, 5
end

-- Reads the counters (after every ARGV was checked). sem: nil + the stored pair when the
-- hash was made with another (value, bounded).
local function open(ctx)
    if ctx.kind == 'sem' then
        local m = redis.call('HMGET', H, '#free', '#value', '#bounded', '#held')
        if m[2] and (tonumber(m[2]) ~= ctx.value or tonumber(m[3]) ~= ctx.bounded) then
            return redis.error_reply('RLOCKS_SEM_MISMATCH ' .. m[2] .. ' ' .. m[3])
        end
        ctx.free = tonumber(m[1]) or ctx.value
        ctx.held = tonumber(m[4]) or 0
        ctx.stored = m -- (finish writes the counters back only if they differ)
    elseif ctx.kind == 'rw' then
        local m = redis.call('HMGET', H, '#w', '#nr')
        ctx.writer = m[1] or nil
        ctx.nr = tonumber(m[2]) or 0
        ctx.stored = m
    else
        ctx.nheld = redis.call('HLEN', H)
    end
    return nil
end

-- The next fencing token of this primitive (see "Fencing tokens" in the header).
local function next_token(ctx)
    -- a hash, not a string: the hash commands are those an ACL user already has
    if ctx.tok == nil then ctx.tok = tonumber(redis.call('HGET', F, 'last')) or 0 end
    local t = math.max(ctx.tok + 1, ctx.us)
    ctx.tok = t
    redis.call('HSET', F, 'last', fmt(t))
    return t
end

local function hfield(ctx, side, owner)
    if ctx.kind == 'rw' then return side .. ':' .. owner end
    return owner
end

-- Whether nothing at all is held, by the counters alone (then H has no hold and L is
-- empty: nothing to read).
local function holds_nothing(ctx)
    if ctx.kind == 'rlock' then return ctx.nheld == 0 end
    if ctx.kind == 'sem' then return ctx.held == 0 end
    return ctx.writer == nil and ctx.nr == 0
end

-- The owner's holds on `side`, or nil. The counters rule out most owners without a read.
local function held_by(ctx, side, owner)
    if holds_nothing(ctx) or (ctx.kind == 'rw' and
            ((side == 'w' and ctx.writer ~= owner) or (side == 'r' and ctx.nr == 0))) then
        return nil
    end
    return tonumber(redis.call('HGET', H, hfield(ctx, side, owner)))
end

-- Capacity bookkeeping, shared by real grants and fair = 0 reservations. `cap` is ctx or
-- a copy of its counters; `fresh` = the owner held nothing on that side before.
local function fits(ctx, cap, side, owner, want)
    if ctx.kind == 'rlock' then return cap.nheld == 0 end
    if ctx.kind == 'sem' then return cap.free >= want end
    if side == 'w' then return cap.writer == nil and cap.nr == 0 end
    return cap.writer == nil or cap.writer == owner
end

-- Whether nothing any entry may ask fits `cap` (so the queue need not be read): an
-- rlock already held, a semaphore without a free permit (every entry wants >= 1), an
-- RWLock with a writer. (Only its writer could take the read side then, and a writer
-- never waits in the queue: its re-entry and its read side are granted at once.)
local function full(ctx, cap)
    if ctx.kind == 'rlock' then return cap.nheld > 0 end
    if ctx.kind == 'sem' then return cap.free < 1 end
    return cap.writer ~= nil
end

local function take(ctx, cap, side, owner, want, fresh)
    if ctx.kind == 'rlock' then
        if fresh then cap.nheld = cap.nheld + 1 end
    elseif ctx.kind == 'sem' then
        cap.free = cap.free - want
        cap.held = cap.held + want
    elseif side == 'w' then
        cap.writer = owner
    elseif fresh then
        cap.nr = cap.nr + 1
    end
end

-- A hold of `field` ended entirely (release, expiry, revocation): counters follow.
local function gone(ctx, field)
    if ctx.kind == 'rlock' then
        ctx.nheld = ctx.nheld - 1
    elseif ctx.kind == 'rw' then
        if string.sub(field, 1, 1) == 'w' then ctx.writer = nil else ctx.nr = ctx.nr - 1 end
    end
end

-- Lease end of `member` in `zset` becomes at least `ends` (never shortened: a renewal or
-- grant never cuts a live lease; ZADD GT would need 6.2 too, but compare in Lua anyway).
local function extend(ctx, zset, member, ends)
    local cur = tonumber(redis.call('ZSCORE', zset, member))
    if cur == nil or cur < ends then
        redis.call('ZADD', zset, ends, member)
        if zset == L then ctx.lset = ends end
        return ends
    end
    return cur
end

-- Add holds; returns the owner's count on that side now, its lease end and the fencing
-- token of a fresh rlock/rw hold (0: re-entry, or a semaphore).
local function grant(ctx, side, owner, add, ends)
    local field = hfield(ctx, side, owner)
    local count = redis.call('HINCRBY', H, field, add)
    take(ctx, ctx, side, owner, add, count == add)
    if count == add then
        redis.call('ZADD', L, ends, field) -- a fresh hold: no lease to compare with
        ctx.lset = ends
        local token = 0
        if ctx.kind ~= 'sem' then token = next_token(ctx) end
        return count, ends, token
    end
    return count, extend(ctx, L, field, ends), 0
end

-- Remove `n` holds (nil = all) of `side` from `owner`; returns how many were removed.
-- sem: the permits go back to #free only when `refund` (revocation); a release adds its
-- own count to #free itself. `count`: the owner's holds on that side if the caller has
-- just read them (saves the read), else nil.
local function drop(ctx, side, owner, n, refund, count)
    local field = hfield(ctx, side, owner)
    if count == nil then count = tonumber(redis.call('HGET', H, field)) end
    if count == nil then return 0 end
    if n == nil or n > count then n = count end
    if count - n > 0 then
        redis.call('HSET', H, field, count - n)
    else
        redis.call('HDEL', H, field)
        redis.call('ZREM', L, field)
        gone(ctx, field)
    end
    if ctx.kind == 'sem' then
        ctx.held = ctx.held - n
        if refund then ctx.free = ctx.free + n end
    end
    return n
end

-- A wake-up line for `waiter`, sent to its process by finish(): published on `entry`'s
-- channel, or pushed to `entry`'s list when `e` (the entry) has b = 1.
local function wake(ctx, what, waiter, token, entry, e)
    local line = what .. ' ' .. waiter
    if token ~= nil then line = line .. ' ' .. fmt(token) end
    ctx.wakes[#ctx.wakes + 1] = line
    local lines = ctx.pub[entry]
    if lines == nil then
        lines = {}
        ctx.pub[entry] = lines
        ctx.pub_order[#ctx.pub_order + 1] = entry
    end
    if e.b == 1 then ctx.listed[entry] = e.l or ctx.elease end
    lines[#lines + 1] = line
end

local function get_entry(entry)
    local raw = redis.call('HGET', W, 'e:' .. entry)
    if not raw then return nil end
    return cjson.decode(raw)
end

local function remove_entry(ctx, entry)
    ctx.qdirty = true
    redis.call('ZREM', Q, entry)
    redis.call('HDEL', W, 'e:' .. entry)
    redis.call('ZREM', T, 'e:' .. entry)
end

-- Put `entry` in the queue (at the tail), or re-point it keeping its place; its lease
-- restarts. `old`: the entry as the caller read it (get_entry), nil if none. Returns
-- its position (1 = head).
local function enqueue(ctx, entry, e, old)
    ctx.qdirty = true
    ctx.tn = ctx.tn + 1
    -- (an entry without its record has no place: the two are written and removed together)
    if old == nil or redis.call('ZSCORE', Q, entry) == false then
        redis.call('ZADD', Q, redis.call('HINCRBY', W, '#seq', 1), entry)
        e.t = ctx.now
        -- A new place: lines left from an earlier one (a grant its waiter learnt from a
        -- reply) must never reach the waiter that reads the list from now on.
        redis.call('DEL', CHANNEL .. ':' .. entry)
    else
        -- re-pointed: the place, and so the time it was taken, stay
        e.t = old.t or ctx.now
    end
    if e.l == nil then e.l = ctx.elease end
    redis.call('HSET', W, 'e:' .. entry, cjson.encode(e))
    redis.call('ZADD', T, ctx.now + ctx.elease, 'e:' .. entry)
    return redis.call('ZRANK', Q, entry) + 1
end

local function clear_marker(ctx, waiter)
    if redis.call('HDEL', W, 'g:' .. waiter) == 1 then
        ctx.qdirty = true
        redis.call('ZREM', T, 'g:' .. waiter)
    end
end

local function get_marker(waiter)
    local raw = redis.call('HGET', W, 'g:' .. waiter)
    if not raw then return nil end
    return cjson.decode(raw)
end

-- Give back a hand-over grant its waiter never adopted (died, timed out): returns the
-- holds given back (the owner may have released some already).
local function revoke(ctx, waiter, m)
    clear_marker(ctx, waiter)
    return drop(ctx, m.s, m.o, m.n, true)
end

-- A call of `waiter`'s owner on `side` adopts its hand-over grant: the marker goes (the
-- owner knows it holds it). An RWLock grant of the other side stays: its owner holds
-- nothing there that it knows of (a wait that ended as the hand-over came, whose leave
-- is on its way), and a marker-less hold would live out its lease unowned.
-- Whether `waiter` has an unadopted grant; of `side` only when given (an rw side).
local function has_marker(waiter, side)
    if side == nil then return redis.call('HEXISTS', W, 'g:' .. waiter) == 1 end
    local m = get_marker(waiter)
    return m ~= nil and m.s == side
end

local function adopted(ctx, waiter, side)
    if ctx.kind == 'rw' and not has_marker(waiter, side) then return end
    clear_marker(ctx, waiter)
end

-- Everything whose lease ended by ctx.now: dead holds go (sem: permits come back, bounded
-- as in sem_lib), expired entries leave the queue, unadopted grants are revoked.
-- Amortised O(log n) per ended item: each is removed once.
local function purge(ctx)
    local ended = holds_nothing(ctx) and {} or redis.call('ZRANGEBYSCORE', L, '-inf', ctx.now)
    for _, field in ipairs(ended) do
        local count = tonumber(redis.call('HGET', H, field))
        redis.call('HDEL', H, field)
        redis.call('ZREM', L, field)
        if count ~= nil then
            gone(ctx, field)
            if ctx.kind == 'sem' then
                ctx.held = ctx.held - count
                local free = ctx.free + count
                if ctx.bounded == 1 then
                    -- what comes back never lifts free + live holds above the value
                    free = math.min(free, math.max(ctx.free, ctx.value - ctx.held))
                end
                ctx.free = free
            end
        end
    end
    -- tn = 0: no entry and no unadopted grant at all, so the queue work can be skipped
    -- (the uncontended path); tn > 0: some may exist. Only ever raised afterwards, never
    -- trusted lower. One read tells both that and whether anything is due.
    local first = redis.call('ZRANGE', T, 0, 0, 'WITHSCORES')
    if first[2] == nil then
        ctx.tn = 0
        return
    end
    ctx.tn = 1
    if tonumber(first[2]) > ctx.now then return end
    for _, member in ipairs(redis.call('ZRANGEBYSCORE', T, '-inf', ctx.now)) do
        ctx.qdirty = true
        local id = string.sub(member, 3)
        if string.sub(member, 1, 2) == 'e:' then
            remove_entry(ctx, id)
        else
            local m = get_marker(id)
            if m then revoke(ctx, id, m) else clear_marker(ctx, id) end
        end
    end
end

-- purge, then `waiter`'s hand-over grant not adopted yet, or nil (tn = 0: none exists).
local function purged_marker(ctx, waiter)
    purge(ctx)
    if ctx.tn > 0 then return get_marker(waiter) end
    return nil
end

-- Hand `e` (an entry's record, of `entry`'s place) what it asks, as a hand-over grant:
-- the holds live the entry lease its waiter asked for (not this caller's: the waiter counts
-- on it when it keeps the grant without adopting it), but never past `entry_end` (the end
-- the entry had; nil: no entry), a marker (with the fencing token, for ADOPTED) lets its
-- adoption, or its revocation at that end, find the grant, and a 'g' line wakes the
-- waiter. The caller has taken the entry out of the queue, or never put it there.
--
-- Why `entry_end`: a waiter that died while queued must delay the next holder by one
-- entry lease at most. A fresh lease from the grant would add a second one when the grant
-- comes just before the dead entry would have ended. A live waiter loses nothing by the
-- cap: its entry's end is at least its last queueing call plus its entry lease, which is
-- all it counts on (queued._short_lease_end), and renewals only move that end later.
local function hand(ctx, e, entry, entry_end)
    local ends = ctx.now + (e.l or ctx.elease)
    if entry_end ~= nil and entry_end < ends then ends = entry_end end
    local _, _, token = grant(ctx, e.s, e.o, e.n, ends)
    -- No older marker of e.w can exist: a waiter's acquire adopts its grant first.
    redis.call('HSET', W, 'g:' .. e.w, cjson.encode({o = e.o, s = e.s, n = e.n, t = fmt(token)}))
    redis.call('ZADD', T, ends, 'g:' .. e.w)
    ctx.qdirty = true
    ctx.tn = ctx.tn + 1
    ctx.granted = ctx.granted + 1
    if ctx.kind == 'sem' then token = nil end
    wake(ctx, 'g', e.w, token, entry, e)
end

-- Grant queued entries, head first, while the head fits (strict FIFO: a head that does
-- not fit blocks those behind it, so a large request or a writer never starves).
-- fair = 0: an entry not woken yet is woken ('w'), its share reserved instead of granted
-- and its patience starts; one already woken (it lost the race) keeps its share reserved
-- without a new wake-up (waking it at every release would cost its process a round trip
-- per section of the barger's) until its patience has ended, then it is granted.
-- Cost: O(log n) per entry granted or woken.
local function handover(ctx)
    if ctx.tn == 0 then return end
    local cap = {free = ctx.free, held = ctx.held, writer = ctx.writer, nr = ctx.nr,
                 nheld = ctx.nheld}
    local i = 0
    while true do
        if full(ctx, cap) then return end
        local top = redis.call('ZRANGE', Q, i, i)[1]
        if not top then return end
        local e = get_entry(top)
        if not fits(ctx, cap, e.s, e.o, e.n) then return end
        -- (only an rw reader may hold already: an rlock that fits is free, and a
        -- semaphore's take does not ask)
        local fresh = ctx.kind ~= 'rw' or held_by(ctx, e.s, e.o) == nil
        take(ctx, cap, e.s, e.o, e.n, fresh)
        if ctx.fair == 1 or (e.k == 1 and ctx.now >= (e.p or 0)) then
            local entry_end = tonumber(redis.call('ZSCORE', T, 'e:' .. top))
            remove_entry(ctx, top)
            hand(ctx, e, top, entry_end)
        elseif e.k == 1 then
            -- passed over within its patience: it asks again when that ends (its QUEUED
            -- reply said when), or this walk grants it at a release after that
            i = i + 1
        else
            e.k = 1
            e.p = ctx.now + ctx.patience
            ctx.qdirty = true
            redis.call('HSET', W, 'e:' .. top, cjson.encode(e))
            wake(ctx, 'w', e.w, nil, top, e)
            i = i + 1
        end
    end
end

-- ms from now to the earliest holder lease end (>= 1), or -1 without holders.
local function earliest_hold(ctx)
    local first = redis.call('ZRANGE', L, 0, 0, 'WITHSCORES')
    if first[2] == nil then return -1 end
    return math.max(1, tonumber(first[2]) - ctx.now)
end

local function lease_left(ctx, side, owner)
    local ends = tonumber(redis.call('ZSCORE', L, hfield(ctx, side, owner)))
    if ends == nil then return -1 end
    return ends - ctx.now
end

local function expire_all(keys, ends, now)
    if ends == nil then
        redis.call('DEL', unpack(keys))
        return
    end
    for _, key in ipairs(keys) do redis.call('PEXPIRE', key, ends - now) end
end

-- Write the counters back, keep every key's PEXPIRE at or after its latest live end (so a
-- primitive whose processes all died disappears), publish the wake-ups, build the reply.
-- An rlock's H and L expire at their latest end as some call set it: only a call that
-- wrote an end to L (ctx.lset) can need a later one. (A shorter one left by a hold that
-- ended only delays the keys' end; they go as soon as they are empty anyway.)
local function finish(ctx, status, value, aux)
    -- rw and sem: a hand-over grant to an owner that holds that side already shares the
    -- owner's lease, so only its marker can take the grant back (revoke), and the marker
    -- must not vanish with the queue keys at the very moment it would be due: while a
    -- marker is left, those keys outlive every hold. An rlock's grant is always a fresh
    -- hold that ends with its marker, so its queue keys need only outlive their own ends.
    local shared = ctx.kind ~= 'rlock'
    local last = nil
    if ctx.kind == 'rlock' and ctx.nheld == 1 and ctx.lset then
        last = ctx.lset -- one holder, whose end this call wrote last
    elseif ctx.lset or shared then
        last = tonumber(redis.call('ZRANGE', L, -1, -1, 'WITHSCORES')[2])
    end
    if ctx.kind == 'sem' then
        if holds_nothing(ctx) and ctx.free == ctx.value then
            redis.call('DEL', H)
            if last ~= nil then redis.call('DEL', L) end -- (no hold: no end can be live)
        else
            local was, now = ctx.stored, {fmt(ctx.free), fmt(ctx.value), fmt(ctx.bounded),
                                          fmt(ctx.held)}
            if was[1] ~= now[1] or was[2] ~= now[2] or was[3] ~= now[3] or was[4] ~= now[4] then
                redis.call('HSET', H, '#free', now[1], '#value', now[2], '#bounded', now[3],
                    '#held', now[4])
            end
            local after = ctx.free + ctx.held
            if ctx.bounded == 1 and after > ctx.value then after = ctx.value end
            -- Only while the state left once every lease ends is the initial one may the
            -- key vanish with its last lease; otherwise it must persist. L goes with H
            -- (the ends it lists are how a dead holder's permits come back): a longer
            -- life outlives H's counters, which then say nothing is held and L is never
            -- read again; a shorter one leaves H's permits to holders nobody can find dead.
            if last ~= nil and after == ctx.value then
                redis.call('PEXPIRE', H, last - ctx.now)
                redis.call('PEXPIRE', L, last - ctx.now)
            else
                redis.call('PERSIST', H)
                if last ~= nil then redis.call('PERSIST', L) end
            end
        end
    elseif ctx.kind == 'rw' then
        if holds_nothing(ctx) then
            redis.call('DEL', H)
        else
            local was = ctx.stored
            if ctx.writer == nil and was[1] then
                redis.call('HDEL', H, '#w')
            elseif ctx.writer ~= nil and was[1] ~= ctx.writer then
                redis.call('HSET', H, '#w', ctx.writer)
            end
            if was[2] ~= fmt(ctx.nr) then redis.call('HSET', H, '#nr', fmt(ctx.nr)) end
            -- (as an rlock's: only a call that wrote a hold's end can need a later expiry)
            if ctx.lset then redis.call('PEXPIRE', H, last - ctx.now) end
        end
    elseif ctx.lset and last ~= nil then
        redis.call('PEXPIRE', H, last - ctx.now)
    end
    if ctx.lset and ctx.kind ~= 'sem' then
        -- (L alone: expire_all's table and loop cost more than the command, on the
        -- uncontended path)
        if last == nil then redis.call('DEL', L) else redis.call('PEXPIRE', L, last - ctx.now) end
    end
    if ctx.qdirty or (shared and ctx.tn > 0 and ctx.lset) then
        local tlast = tonumber(redis.call('ZRANGE', T, -1, -1, 'WITHSCORES')[2])
        if shared and tlast ~= nil and last ~= nil and last > tlast then tlast = last end
        expire_all({Q, W, T}, tlast, ctx.now)
    end
    -- One message per woken process, on its own channel: a hand-over wakes only the
    -- processes it names, not every process that waits.
    for _, entry in ipairs(ctx.pub_order) do
        local name, text = CHANNEL .. ':' .. entry, table.concat(ctx.pub[entry], '\n')
        local life = ctx.listed[entry]
        if life == nil then
            redis.call(ctx.publish, name, text)
        else
            redis.call('RPUSH', name, text)
            redis.call('PEXPIRE', name, life)
        end
    end
    if ctx.token ~= nil and ctx.token > 0 then
        return {status, value, aux, ctx.wakes, {}, ctx.token}
    end
    return {status, value, aux, ctx.wakes}
end

-- The reply table as the text every script answers (the header's reply shape); an error
-- reply goes through as it is. Called once, by the function (or EVAL form) around each
-- operation file (scripts.py), so the library's own code keeps the table.
local function reply_text(reply)
    if reply.err then return reply end
    local head = string.format('%d %d %d %d', reply[1], reply[2], reply[3] or 0, reply[6] or 0)
    local items = reply[5]
    if items ~= nil and #items > 0 then
        local parts = {}
        for k, item in ipairs(items) do parts[k] = fmt(item) end
        head = head .. ' ' .. table.concat(parts, ',')
    end
    local wakes = reply[4]
    if wakes == nil or #wakes == 0 then return head end
    return head .. '\n' .. table.concat(wakes, '\n')
end

-- The acquiring caller adopts `m`, its waiter's hand-over grant (its marker cleared
-- already), of which its owner now holds `count`: nothing is added, the hold's lease
-- becomes the caller's ttl, and the reply is ADOPTED with the grant's fencing token.
local function adopt(ctx, a, m, count)
    extend(ctx, L, hfield(ctx, m.s, m.o), ctx.now + a.ttl)
    ctx.token = tonumber(m.t) -- a string: cjson would round 16 digits
    handover(ctx)
    return finish(ctx, 2, count, lease_left(ctx, m.s, m.o))
end

-- acquire, shared by every primitive. a = {owner, waiter, entry, side, ttl, add, reentry,
-- other, queue}; other (rw): 1 = the caller holds the other side, else 0.
-- rlock/rw: waiter == owner. See the per-script headers for the replies.
local function op_acquire(ctx, a)
    local m = purged_marker(ctx, a.waiter)
    if m ~= nil and ctx.kind == 'rw' and m.s ~= a.side and a.other == 0 then
        -- A grant of the other side its owner never recorded (it holds nothing there:
        -- a wait that ended as the hand-over came, whose leave may still be on its way)
        -- is given back, as that leave would, before this call goes on. Kept, it would
        -- outlive the wait for its short lease, and a read grant would make this write
        -- call an upgrade.
        revoke(ctx, a.waiter, m)
        m = nil
    end
    if m ~= nil then
        -- The waiter holds a hand-over grant: the caller has it now, so it is adopted.
        -- Asking for the same thing without re-entry is the re-check after a missed
        -- wake-up: answer it without counting twice. Anything else (re-entry, a writer
        -- taking the read side) shows the caller recorded the grant: go on as usual.
        clear_marker(ctx, a.waiter)
        local count = held_by(ctx, m.s, m.o)
        if a.reentry == 0 and count ~= nil and m.s == a.side then
            return adopt(ctx, a, m, count)
        end
    end
    local mine = nil -- a semaphore has no re-entry: permits are counted, not owned
    if ctx.kind ~= 'sem' then mine = held_by(ctx, a.side, a.owner) end
    if a.reentry == 1 and mine == nil then
        -- Granting it as a fresh hold would let an inner release end a hold that an outer
        -- frame still believes it has.
        handover(ctx)
        return finish(ctx, -1, 0, 0)
    end
    if ctx.kind == 'rw' then
        if a.side == 'w' and mine == nil and held_by(ctx, 'r', a.owner) ~= nil then
            handover(ctx)
            return finish(ctx, -2, 0, 0)
        end
        if a.side == 'r' and mine == nil and ctx.writer == a.owner then
            mine = 0 -- downgrade: granted at once, like a re-entry
        end
    end
    if ctx.kind ~= 'sem' and mine ~= nil then
        -- Re-entry never queues: the holder is not waiting for anyone. (A downgrade's
        -- read hold is fresh: it gets a token of its own.)
        local count, ends, token = grant(ctx, a.side, a.owner, a.add, ctx.now + a.ttl)
        ctx.token = token
        handover(ctx)
        return finish(ctx, 1, count, ends - ctx.now)
    end
    local rank = false
    local first = false
    if full(ctx, ctx) then
        -- Nothing any entry asks fits (an rlock or a write side held, no free permit):
        -- no grant can come of this call, to the caller or to those ahead, so neither
        -- its place nor the queue is read.
    elseif ctx.fair == 1 then
        if ctx.tn > 0 then rank = redis.call('ZRANK', Q, a.entry) end
        -- Those ahead of the caller go first; the caller only if nobody is left ahead.
        if rank ~= 0 then
            handover(ctx)
            if ctx.granted > 0 then
                rank = redis.call('ZRANK', Q, a.entry)
                -- The walk may have reached the caller's own entry (readers, permits:
                -- room for it too) and granted it: that grant is the caller's, adopted
                -- now, never granted a second time (bug hunt: a reader counted twice).
                local walked = get_marker(a.waiter)
                if walked ~= nil then
                    clear_marker(ctx, a.waiter)
                    return adopt(ctx, a, walked, held_by(ctx, walked.s, walked.o))
                end
            end
        end
        first = rank == 0 or
            (rank == false and (ctx.tn == 0 or redis.call('ZCARD', Q) == 0))
    else
        if ctx.tn > 0 then rank = redis.call('ZRANK', Q, a.entry) end
        first = true
    end
    if first and fits(ctx, ctx, a.side, a.owner, a.add) then
        if rank ~= false then remove_entry(ctx, a.entry) end
        local count, ends, token = grant(ctx, a.side, a.owner, a.add, ctx.now + a.ttl)
        ctx.token = token
        handover(ctx)
        return finish(ctx, 1, count, ends - ctx.now)
    end
    if a.queue == 0 then
        handover(ctx)
        local queued = 0
        if ctx.tn > 0 then queued = redis.call('ZCARD', Q) end
        return finish(ctx, 0, earliest_hold(ctx), queued)
    end
    local k, p = 0, nil
    local old = get_entry(a.entry)
    if old ~= nil then k, p = old.k, old.p end
    local b = nil -- (queue = 2: the waiter reads its lines from the list)
    if a.queue == 2 then b = 1 end
    local mine_now = {w = a.waiter, o = a.owner, s = a.side, n = a.add, k = k, p = p, b = b}
    local position = enqueue(ctx, a.entry, mine_now, old)
    -- fair = 1 offered the primitive to those ahead already; fair = 0 wakes them here.
    -- The caller's own entry cannot be granted, woken or changed by it: it did not fit
    -- the whole capacity, so the walk stops there at the latest.
    local granted = ctx.granted
    handover(ctx)
    if ctx.granted > granted then position = redis.call('ZRANK', Q, a.entry) + 1 end
    local hint = earliest_hold(ctx)
    if mine_now.k == 1 and mine_now.p ~= nil and mine_now.p > ctx.now
            and (hint < 0 or mine_now.p - ctx.now < hint) then
        -- woken and passed over: ask again when the patience ends, in case the barger
        -- left the primitive free (no release would come to grant it)
        hint = mine_now.p - ctx.now
    end
    if ctx.kind ~= 'sem' then
        -- Every later grant gets a token above this one, so the waiter can tell a grant
        -- line made after this call from one made before it (queued.py, the fast path).
        ctx.token = ctx.tok or tonumber(redis.call('HGET', F, 'last')) or 0
    end
    return finish(ctx, 3, position, hint)
end

-- The optional carried queueing of a release (rlock and rw): nil when ARGV[i] is absent
-- or '', else {entry, waiter, side, n} from ARGV[i..] (rw: entry, waiter, side, count;
-- rlock: entry, waiter, count).
local function carry_args(ctx, i)
    if ARGV[i] == nil or ARGV[i] == '' then return nil end
    local c = {entry = str_arg(i, 'carry entry'), waiter = str_arg(i + 1, 'carry waiter'),
               side = 'x'}
    if ctx.kind == 'rw' then
        c.side = side_arg(i + 2, 'carry side', 'rw')
        i = i + 1
    end
    c.n = int_arg(i + 2, 'carry count', 1)
    if ARGV[i + 3] ~= nil then bad = bad or 'RLOCKS_BAD_ARG carry' end
    return c
end

-- Queue the releasing process's next waiter `c` as its own acquire with queue = 2 would
-- for a caller that holds nothing (the release files say why). Not when its entry or an
-- unadopted grant to it exists already: that waiter asks itself then. Returns the items
-- {3, position (0: granted at once, in wakes), hint, last token} or {0, 0, 0, 0}.
local function carry(ctx, c)
    -- (tn = 0: no entry and no marker exists at all; else one read for both)
    if ctx.tn > 0 then
        local found = redis.call('HMGET', W, 'e:' .. c.entry, 'g:' .. c.waiter)
        if found[1] or found[2] then return {0, 0, 0, 0} end
    end
    local e = {w = c.waiter, o = c.waiter, s = c.side, n = c.n, k = 0, b = 1}
    -- (read before any grant to the waiter below: its grant's token is then above this
    -- one, as every grant after its acquire's QUEUED reply is)
    local token = ctx.tok or tonumber(redis.call('HGET', F, 'last')) or 0
    -- (fits first: after the hand-over an rlock with anyone queued is held, so the queue
    -- is read only where it may be empty)
    if fits(ctx, ctx, c.side, c.waiter, c.n) and (ctx.tn == 0 or redis.call('ZCARD', Q) == 0)
    then
        -- Nobody queued and it fits: granted at once, as its own acquire would be
        -- (op_acquire grants a first caller that fits without an entry), but as a
        -- hand-over (the waiter did not make this call), with no entry written only to
        -- be taken out again. Its list starts afresh, as at a new place (enqueue).
        redis.call('DEL', CHANNEL .. ':' .. c.entry)
        hand(ctx, e, c.entry)
        return {3, 0, earliest_hold(ctx), token}
    end
    local position = enqueue(ctx, c.entry, e, nil)
    local granted = ctx.granted
    handover(ctx)
    if ctx.granted > granted then
        local rank = redis.call('ZRANK', Q, c.entry)
        position = rank and rank + 1 or 0
    end
    return {3, position, earliest_hold(ctx), token}
end

-- release for rlock and rw: r = {owner, side, n[, carry]} (carry: see carry_args).
local function op_release(ctx, r)
    purge(ctx)
    local mine = held_by(ctx, r.side, r.owner)
    if mine == nil then
        handover(ctx)
        return finish(ctx, -1, 0, 0)
    end
    -- the owner releasing it knows it holds it: its own grant counts as adopted
    -- (tn = 0: no grant marker exists at all)
    if ctx.tn > 0 then adopted(ctx, r.owner, r.side) end
    local left = mine - drop(ctx, r.side, r.owner, r.n, false, mine)
    handover(ctx)
    local items = nil
    if r.carry ~= nil then items = carry(ctx, r.carry) end
    local reply = finish(ctx, 1, left, 0)
    if items ~= nil then reply[5] = items end
    return reply
end

-- leave: l = {owner, waiter, entry, next_waiter, next_owner, next_side, next_want}.
local function op_leave(ctx, l)
    local m = purged_marker(ctx, l.waiter)
    if m ~= nil then
        -- The hand-over raced the time-out: pass the grant on now, never leaving the
        -- primitive held by somebody who does not know it.
        local n = revoke(ctx, l.waiter, m)
        handover(ctx)
        return finish(ctx, 4, n, 0)
    end
    local e = get_entry(l.entry)
    if e == nil or e.w ~= l.waiter then
        handover(ctx)
        return finish(ctx, -1, 0, 0)
    end
    if l.next_waiter ~= '' then
        enqueue(ctx, l.entry, {w = l.next_waiter, o = l.next_owner, s = l.next_side,
            n = l.next_want, k = e.k, p = e.p}, e)
        -- the next waiter may fit where the leaving one did not (a reader after a writer)
        handover(ctx)
        local rank = redis.call('ZRANK', Q, l.entry)
        if rank == false then return finish(ctx, 1, 0, 0) end
        return finish(ctx, 1, rank + 1, 0)
    end
    remove_entry(ctx, l.entry)
    handover(ctx)
    return finish(ctx, 1, 0, 0)
end

-- renew: items from ARGV[first] on, pairs (kind, id): 'h' = hold of owner id (rlock,
-- sem), 'r'/'w' = rw read/write hold of owner id, 'e' = queue entry id, 'a' = adopt the
-- hand-over grant of waiter id ('ar'/'aw', rw: only a grant of that side), 't' = (rlock,
-- rw) issue a fresh fencing token to the hold whose holds-hash field is id (an acquire
-- whose reply was lost: its grant's token never reached the owner; the new one is above
-- every token issued before, so the order of grants holds). Holds get now + ttl, entries
-- now + entry lease; neither is ever shortened. Renewing an rlock or rw hold also adopts
-- its owner's hand-over grant of that side (there the waiter id is the owner id, and
-- only a process that recorded the grant renews it).
-- Per item: 1 = renewed/adopted/issued, -1 = not there (lost, left, expired).
local function op_renew(ctx, ttl, first)
    purge(ctx)
    local results, ok = {}, 0
    -- 'a' items first: each says whether its grant was unadopted when the call began,
    -- though a hold item of the same owner, anywhere in the list, adopts it too. rw:
    -- 'ar' / 'aw' adopt only a grant of that side (see adopted()).
    for i = first, #ARGV - 1, 2 do
        local kind, id = ARGV[i], ARGV[i + 1]
        if string.sub(kind, 1, 1) == 'a' then
            local n = (i - first) / 2 + 1
            results[n] = -1
            local side = nil
            if kind ~= 'a' then side = string.sub(kind, 2) end
            if has_marker(id, side) then
                clear_marker(ctx, id)
                results[n] = 1
                ok = ok + 1
            end
        end
    end
    for i = first, #ARGV - 1, 2 do
        local kind, id = ARGV[i], ARGV[i + 1]
        local done = false
        if string.sub(kind, 1, 1) == 'a' then
            done = nil -- answered above
        elseif kind == 't' then
            if redis.call('HEXISTS', H, id) == 1 then
                ctx.token = next_token(ctx)
                done = true
            end
        elseif kind == 'e' then
            if redis.call('ZSCORE', Q, id) ~= false then
                ctx.qdirty = true
                extend(ctx, T, 'e:' .. id, ctx.now + ctx.elease)
                done = true
            end
        else
            local side = kind
            if kind == 'h' then side = 'x' end
            local field = hfield(ctx, side, id)
            if redis.call('HEXISTS', H, field) == 1 then
                extend(ctx, L, field, ctx.now + ttl)
                if ctx.tn > 0 and ctx.kind ~= 'sem' then adopted(ctx, id, side) end
                done = true
            end
        end
        local n = (i - first) / 2 + 1
        if done then
            ok = ok + 1
            results[n] = 1
        elseif done == false then
            results[n] = -1
        end
    end
    handover(ctx)
    local reply = finish(ctx, 1, ok, 0)
    reply[5] = results
    return reply -- (reply[6]: the token of a 't' item, if any)
end

-- Checks renew's item list; returns the ttl.
local function renew_args(ctx, i)
    local ttl = int_arg(i, 'ttl', 1)
    if (#ARGV - i) % 2 ~= 0 then bad = bad or 'RLOCKS_BAD_ARG items' end
    for j = i + 1, #ARGV - 1, 2 do
        local kind = ARGV[j]
        local allowed = kind == 'e' or kind == 'a' or
            (ctx.kind == 'rw' and (kind == 'r' or kind == 'w' or kind == 'ar' or kind == 'aw')) or
            (ctx.kind ~= 'rw' and kind == 'h') or (ctx.kind ~= 'sem' and kind == 't')
        if not allowed then bad = bad or 'RLOCKS_BAD_ARG item kind' end
        str_arg(j + 1, 'item id')
    end
    return ttl
end
