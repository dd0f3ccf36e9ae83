-- rw_renew: extend this process's holds and queue entry on one RWLock, adopt hand-over
-- grants; one call per lock per renewal pass. Cost O(items x log n): no hash scan.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[5]   ttl, ms (>= 1): a renewed hold's lease ends ttl from now (never shortened)
-- ARGV[6..] pairs (kind, id): 'r' / 'w' <owner> renew that owner's read / write hold;
--           'e' <entry> renew the queue entry; 'a' <waiter> adopt its hand-over grant
--           ('ar' / 'aw': only a grant of the read / write side);
--           't' 'r:<owner>' / 'w:<owner>' issue that hold a fresh fencing token
--
-- Reply: status 1, value = items done, aux 0, token = a 't' item's new token (0: none),
-- items = per-item statuses (1 done, -1 not there), then the wake lines.
local ctx, i = context('rw')
local ttl = renew_args(ctx, i)
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_renew(ctx, ttl, i + 1)
