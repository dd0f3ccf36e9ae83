-- rlock_release: give back holds of an exclusive reentrant lock; when it frees the lock,
-- hand it over in the same script to the oldest live queued waiter.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[5]   owner id
-- ARGV[6]   holds to give back, count (>= 1; more than the owner has: all of them)
-- ARGV[7..9] optional (absent or ARGV[7] = '': none): the releasing process's next waiter,
--           which waited for this release to queue (wakehub.py, WakeHub.unregister), is
--           queued in this same script, after the hand-over, as its own rlock_acquire with
--           queue = 2 would: ARGV[7] its entry id, ARGV[8] its id (owner and waiter),
--           ARGV[9] holds it wants (>= 1). Its call would otherwise reach Redis beside the
--           next holder's critical section.
--
-- Replies: 1 released (value = the owner's holds left; at 0 the lock went to the head
-- waiter, named in wakes with its fencing token); -1 this owner holds nothing (no hold
-- changed; expired state recovered as by every call; nothing queued). The owner's own
-- unadopted hand-over grant counts as adopted by its release. With ARGV[7], reply 1 has
-- items '<status>,<value>,<aux>,<token>' of the carried queueing: 3 queued (value = its
-- position, 0 when granted at once, in wakes; aux as rlock_acquire's reply 3; token: the
-- last token issued before that queueing's hand-over, so its grant's is above it),
-- or 0,0,0,0: not queued (its entry or an unadopted grant to it exists; it asks itself).
local ctx, i = context('rlock')
local r = {owner = str_arg(i, 'owner'), side = 'x', n = int_arg(i + 1, 'holds', 1)}
r.carry = carry_args(ctx, i + 2)
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_release(ctx, r)
