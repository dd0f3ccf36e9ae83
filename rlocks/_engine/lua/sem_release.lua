-- sem_release: give permits back to a (Bounded)Semaphore and hand them over in the same
-- script to as many queued waiters, in order, as they cover.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..6] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[7]    permits released, count (>= 1): added to #free, as threading.Semaphore does
-- ARGV[8], ARGV[9], ...  pairs (owner id, count >= 1): permits taken off each owner's own
--            record (the releasing thread's first, then other threads of its process, as
--            the engine chose from its local books; the same rule as lua/sem_release.lua);
--            each owner at most once; counts sum to at most ARGV[7]. The rest is a release
--            by nobody's permit.
--            An owner's unadopted hand-over grant ('g:<owner>') is NOT adopted by a
--            release: the releasing thread may be another one, whose books do not have
--            that grant yet (its owner adopts it when it records it). The grant only
--            shrinks to the permits the owner has left, and goes when none are left, so
--            revoking it later never takes permits that were released already.
--
-- Replies (a semaphore release names no single owner, so value is the free count):
--    1  released; value = permits free after the hand-over (grants in wakes), aux = 0
--   -1  the owner of pair value (1-based) holds fewer permits than listed
--   -3  a BoundedSemaphore would have more permits in circulation (free plus held by
--       live owners) than its value
-- Refusals change no permit; expired state is recovered (and what it freed handed over)
-- as by every call.

-- After permits came off `owner`, its unadopted hand-over grant covers at most what it
-- has left (see ARGV[8] above).
local function shrink_marker(ctx, owner)
    local m = get_marker(owner)
    if m == nil then return end
    local left = held_by(ctx, 's', owner) or 0
    if left <= 0 then
        clear_marker(ctx, owner)
    elseif left < m.n then
        m.n = left
        redis.call('HSET', W, 'g:' .. owner, cjson.encode(m))
    end
end

local ctx, i = context('sem')
local give = int_arg(i, 'permits', 1)
local takes, owned = {}, 0
if (#ARGV - i) % 2 ~= 0 then bad = bad or 'RLOCKS_BAD_ARG pairs' end
local seen = {}
for j = i + 1, #ARGV - 1, 2 do
    local n = int_arg(j + 1, 'pair count', 1)
    local owner = str_arg(j, 'pair owner')
    -- each pair is checked against the owner's count alone: a repeated owner could
    -- take off more than it holds, and #free would grow by permits nobody gave back
    if seen[owner] then bad = bad or 'RLOCKS_BAD_ARG pairs' end
    seen[owner] = true
    takes[#takes + 1] = {owner, n}
    owned = owned + n
end
if owned > give then bad = bad or 'RLOCKS_BAD_ARG pairs' end
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
purge(ctx)
for k, take in ipairs(takes) do
    local held = held_by(ctx, 's', take[1]) or 0
    if held < take[2] then
        handover(ctx)
        return finish(ctx, -1, k, 0)
    end
end
-- Permits given back by their holders only move from held to free; the rest would add
-- permits to circulation, which a BoundedSemaphore never lets exceed its value.
if ctx.bounded == 1 and ctx.free + ctx.held + (give - owned) > ctx.value then
    handover(ctx)
    return finish(ctx, -3, 0, 0)
end
ctx.free = ctx.free + give
for _, take in ipairs(takes) do
    drop(ctx, 's', take[1], take[2], false)
    if ctx.tn > 0 then shrink_marker(ctx, take[1]) end
end
handover(ctx)
return finish(ctx, 1, ctx.free, 0)
