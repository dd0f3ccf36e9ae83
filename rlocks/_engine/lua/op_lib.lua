-- op_lib: every operation applied at most once. The loader puts this file after
-- queue_lib.lua and before each operation file, so a script that redis-py (its Retry, the
-- cluster client's retry) sends again after losing its reply is answered from a record
-- and changes nothing. On its own it does nothing; it only wraps queue_lib's functions.
--
-- KEYS (after queue_lib's seven; same hash tag, so the same cluster slot):
--   KEYS[8]  O   op records, hash: <stream> -> '<seq> <n> <status> <value> <aux> <token>
--               <refreshed> <items>' : the last operation of that stream and its reply
--               (n = reply length, items comma-joined; refreshed = when this stream last
--               set its record's end and the record keys' expiry, server ms). A stream is one sequential caller (a thread,
--               an asyncio task, the renewer): its operations never overlap, so one
--               record per stream is enough: a re-send arrives before its next operation.
--               (The engine sends a caller's calls that may grant on a stream of their
--               own, '<owner>/g', so a later release does not overwrite their record.)
--   KEYS[9]  OE  op record ends, ZSET: <stream> -> end (server ms)
--   Without KEYS[8..9] (a script run by hand) no record is read or written.
--
-- Op ARGV: right after the context ARGV (ARGV[5]; sem: ARGV[7]) an argument that starts
-- with '#' (no other ARGV there does: ids never start with '#', counts are numbers):
--   '#<seq>:<stream>'  the operation's id: seq, decimal, unique per stream (a re-send
--                      carries the same one); stream, no whitespace
--   '#'                no id: run as usual, nothing recorded
-- Absent (the next ARGV does not start with '#'): the same as '#', and the indices of
-- the operation's own ARGV do not move. A malformed id: 'RLOCKS_BAD_ARG op'.
--
-- A repeat (same stream, same seq, record alive) of an operation that changed something
-- (status > 0; a refusal is not recorded, see record) gets the recorded reply with no wakes
-- (they were published by the first run); nothing is read or written besides the record.
-- Records end between OP_RECORD_MS and 1.5 x OP_RECORD_MS after their operation (longer
-- than rlocks' socket timeout times a few re-sends: a re-send later than that is run
-- again); a new stream's first record removes up to OP_SWEEP ended ones, so there are
-- never more records than were alive at one time and the cost per operation is
-- O(log records). A stream sets its record's end (1.5 x OP_RECORD_MS ahead) and the
-- record keys' expiry (2 x OP_RECORD_MS ahead) only when its last setting of them is at
-- least half of OP_RECORD_MS old, so most operations write only the record itself. Every
-- setting is the same span, so an expiry only moves later and every record outlives its
-- OP_RECORD_MS; the keys disappear at most 2 x OP_RECORD_MS after the last operation.

local O, OE

local queue_bind = bind

local function bind(keys, argv)
    queue_bind(keys, argv)
    O, OE = keys[8], keys[9]
end
local OP_RECORD_MS = 60000
local OP_SWEEP = 8

local queue_context, queue_open, queue_finish = context, open, finish
local queue_op_acquire, queue_op_release = op_acquire, op_release
local queue_op_leave, queue_op_renew = op_leave, op_renew

-- queue_lib's context, then the op ARGV if there is one (ctx.op = {seq, stream}).
local function context(kind)
    local ctx, i = queue_context(kind)
    local v = ARGV[i]
    if v == nil or string.sub(v, 1, 1) ~= '#' then return ctx, i end
    if v ~= '#' then
        local seq, stream = string.match(v, '^#(%d+):(%S+)$')
        if seq == nil then
            bad = bad or 'RLOCKS_BAD_ARG op'
        elseif O ~= nil and OE ~= nil then
            ctx.op = {seq = seq, stream = stream}
        end
    end
    return ctx, i + 1
end

local RECORD = '^(%d+) (%d) (%-?%d+) (%-?%d+) (%-?%d+) (%d+) (%d+) ?(.*)$'
-- Only a record's seq and refreshed (fields 1 and 7), which every operation reads: one
-- match with two captures instead of two (most of op_lib's server time is such string work).
local HEAD = '^(%d+) %d %-?%d+ %-?%d+ %-?%d+ %d+ (%d+)'

local function replay(rec)
    local _, n, status, value, aux, token, _, items = string.match(rec, RECORD)
    local reply = {tonumber(status), tonumber(value), tonumber(aux), {}}
    if tonumber(n) >= 5 then
        local list = {}
        for item in string.gmatch(items, '[^,]+') do list[#list + 1] = tonumber(item) end
        reply[5] = list
    end
    if tonumber(n) >= 6 then reply[6] = tonumber(token) end
    return reply
end

-- queue_lib's open; for a repeat of the stream's recorded operation, that operation's
-- reply instead (the scripts return what open returns: `if err then return err end`).
local function open(ctx)
    local err = queue_open(ctx)
    if err or ctx.op == nil then return err end
    local rec = redis.call('HGET', O, ctx.op.stream)
    if rec then
        local seq, refreshed = string.match(rec, HEAD)
        if seq == ctx.op.seq then return replay(rec) end
        ctx.op.refreshed = tonumber(refreshed)
    end
    return nil
end

-- Record `reply` as the stream's last operation; returns it. A refusal (status <= 0:
-- busy, not held, upgrade, over) changed nothing but expired state and is not recorded:
-- its repeat is decided afresh, and whichever answer arrives is the only one applied.
local function record(ctx, reply)
    if ctx.op == nil or reply[1] <= 0 then return reply end
    local items = ''
    if reply[5] ~= nil then
        local parts = {}
        for k, item in ipairs(reply[5]) do parts[k] = fmt(item) end
        items = table.concat(parts, ',')
    end
    -- While this stream skips the settings, its record ends after refreshed + 1.5 x
    -- OP_RECORD_MS > now + OP_RECORD_MS, and the keys live past refreshed + 2 x
    -- OP_RECORD_MS, later still. (Set after the writes below: they may create the keys.)
    local refreshed = ctx.op.refreshed
    local refresh = refreshed == nil or ctx.now - refreshed >= OP_RECORD_MS / 2
    if refresh then refreshed = ctx.now end
    redis.call('HSET', O, ctx.op.stream, string.format('%s %d %d %d %d %d %d %s',
        ctx.op.seq, #reply, reply[1], reply[2], reply[3], reply[6] or 0, refreshed, items))
    if refresh and redis.call('ZADD', OE, ctx.now + OP_RECORD_MS * 3 / 2,
            ctx.op.stream) == 1 then
        -- Only a new stream adds a record, and it removes up to OP_SWEEP ended ones: the
        -- count grows only when none had ended, so it never exceeds the most records
        -- alive at one time (never this one: it is live).
        local ended = redis.call('ZRANGEBYSCORE', OE, '-inf', ctx.now, 'LIMIT', 0, OP_SWEEP)
        if #ended > 0 then
            redis.call('HDEL', O, unpack(ended))
            redis.call('ZREM', OE, unpack(ended))
        end
    end
    if refresh then
        redis.call('PEXPIRE', O, 2 * OP_RECORD_MS)
        redis.call('PEXPIRE', OE, 2 * OP_RECORD_MS)
    end
    return reply
end

local function finish(ctx, status, value, aux)
    return record(ctx, queue_finish(ctx, status, value, aux))
end

local function op_acquire(ctx, a) return record(ctx, queue_op_acquire(ctx, a)) end
local function op_release(ctx, r) return record(ctx, queue_op_release(ctx, r)) end
local function op_leave(ctx, l) return record(ctx, queue_op_leave(ctx, l)) end
local function op_renew(ctx, ttl, first) return record(ctx, queue_op_renew(ctx, ttl, first)) end
