-- rw_release: give back read or write holds of an RWLock; what becomes free is handed
-- over in the same script (the next writer, or every reader queued before it).
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[5]   owner id
-- ARGV[6]   side: 'r' or 'w'
-- ARGV[7]   holds to give back, count (>= 1; more than the owner has on that side: all)
-- ARGV[8..11] optional (absent or ARGV[8] = '': none): the releasing process's next
--           waiter, queued in this same script as its own rw_acquire with queue = 2 would
--           (see rlock_release.lua): ARGV[8] its entry id, ARGV[9] its id, ARGV[10] its
--           side 'r' or 'w', ARGV[11] holds it wants (>= 1)
--
-- Replies: 1 released (value = holds left on that side; grants in wakes, each with its
-- fencing token); -1 this owner
-- holds nothing on that side (no hold changed; expired state recovered as by every call;
-- nothing queued). With ARGV[8], reply 1 has the carried queueing's items, as
-- rlock_release's.
local ctx, i = context('rw')
local r = {owner = str_arg(i, 'owner'), side = side_arg(i + 1, 'side', 'rw'),
           n = int_arg(i + 2, 'holds', 1)}
r.carry = carry_args(ctx, i + 3)
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_release(ctx, r)
