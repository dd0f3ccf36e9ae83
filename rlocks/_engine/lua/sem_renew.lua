-- sem_renew: extend this process's permit leases and queue entry on one semaphore, adopt
-- hand-over grants; one call per semaphore per renewal pass. O(items x log n).
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..6] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[7]   ttl, ms (>= 1): the renewed lease ends ttl from now (never shortened)
-- ARGV[8..] pairs (kind, id): 'h' <owner> renew that owner's permits; 'e' <entry> renew
--           the queue entry; 'a' <waiter> adopt that waiter's hand-over grant
--
-- Reply: status 1, value = items done, aux 0, token 0, items = per-item statuses (1 done,
-- -1 not there), then the wake lines; error RLOCKS_SEM_MISMATCH.
local ctx, i = context('sem')
local ttl = renew_args(ctx, i)
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_renew(ctx, ttl, i + 1)
