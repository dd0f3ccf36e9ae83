-- sem_release: give permits back to a (Bounded)Semaphore and hand them over in the same
-- script to as many queued waiters, in order, as they cover.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..6] and the reply shape are there.)
--
-- ARGV[7]   owner id (the releasing process)
-- ARGV[8]   permits released, count (>= 1): added to #free, as threading.Semaphore does
-- ARGV[9]   of those, how many to take off this process's own record, count (0..ARGV[8])
-- ARGV[10..] waiter ids of this process whose hand-over grants the caller recorded and
--           has not adopted yet (adopted now, before the release counts them)
--
-- Replies: 1 released (value = permits this process still holds, aux = permits free
-- after the hand-over); -1 the process holds fewer than ARGV[9] permits here; -3 a
-- BoundedSemaphore would go above its value. Refusals change nothing but expired state.
local ctx, i = context('sem')
local owner = str_arg(i, 'owner')
local give = int_arg(i + 1, 'permits', 1)
local own = int_arg(i + 2, 'own', 0, give)
for j = i + 3, #ARGV do str_arg(j, 'adopt') end
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
purge(ctx)
adopt_list(ctx, i + 3)
local held = held_by(ctx, 's', owner) or 0
if held < own then
    handover(ctx)
    return finish(ctx, -1, 0, 0)
end
if ctx.bounded == 1 and ctx.free + give > ctx.value then
    handover(ctx)
    return finish(ctx, -3, 0, 0)
end
ctx.free = ctx.free + give
if own > 0 then drop(ctx, 's', owner, own, false) end
handover(ctx)
return finish(ctx, 1, held - own, ctx.free)
