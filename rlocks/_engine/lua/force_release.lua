-- force_release: end every hold of a primitive at once (the CLI's `release --force`) and
-- hand it over to the queue, which is kept in order.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it; this script is sent no op ARGV and records nothing.)
--
-- For an operator clearing a primitive whose holder is stuck. Holders still alive find
-- their hold gone at their next renewal or release and report it lost; a semaphore comes
-- back at its initial value (read from the hash before it goes).
--
-- ARGV[5]  kind of the primitive: 'rlock', 'rw' or 'sem'
--
-- Replies: 1 released (the holds hash and lease set were deleted; the queue head(s) the
-- freed primitive covers were granted, named in wakes with their fencing tokens, which
-- stay above those of the holds ended here); -1 there was no holds hash (or a
-- key of another type: left untouched); queued waiters were still offered what is free.
local ctx = context('force')
local kind = ARGV[5]
if kind ~= 'rlock' and kind ~= 'rw' and kind ~= 'sem' then
    bad = bad or 'RLOCKS_BAD_ARG kind'
end
if bad then return redis.error_reply(bad) end
ctx.kind = kind
local kind_of = redis.call('TYPE', H).ok
if kind_of ~= 'hash' and kind_of ~= 'none' then
    return {-1, 0, 0, {}}
end
local status = -1
if kind == 'sem' then
    local m = redis.call('HMGET', H, '#value', '#bounded')
    if not m[1] then return {-1, 0, 0, {}} end
    ctx.value, ctx.bounded = tonumber(m[1]), tonumber(m[2])
end
if kind_of == 'hash' then
    redis.call('DEL', H, L)
    status = 1
end
open(ctx)
purge(ctx)
handover(ctx)
return finish(ctx, status, 0, 0)
