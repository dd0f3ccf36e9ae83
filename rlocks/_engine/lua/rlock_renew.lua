-- rlock_renew: extend this process's holds and queue entry on one lock, adopt hand-over
-- grants; one call per lock per renewal pass.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[5]   ttl, ms (>= 1): a renewed hold's lease ends ttl from now (never shortened)
-- ARGV[6..] pairs (kind, id): 'h' <owner> renew that owner's hold; 'e' <entry> renew the
--           queue entry (entry lease, ARGV[4]); 'a' <waiter> adopt the hand-over grant of
--           that waiter (send it with the 'h' of the same owner: an unadopted grant is
--           revoked when its short lease ends, whatever its hold's lease says); 't'
--           <owner> issue that owner's hold a fresh fencing token (after a lost reply)
--
-- Reply: status 1, value = items done, aux 0, token = a 't' item's new token (0: none),
-- items = per-item statuses (1 done, -1 not there: the hold is lost / the entry left or
-- expired / no grant to adopt), then the wake lines. Dead state found on the way is
-- recovered and handed over (wakes).
local ctx, i = context('rlock')
local ttl = renew_args(ctx, i)
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_renew(ctx, ttl, i + 1)
