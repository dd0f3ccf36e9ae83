-- sem_acquire: take permits of a (Bounded)Semaphore, or queue for them.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..6] and the reply shape are there;
-- ARGV[5] initial value, ARGV[6] bounded.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[7]   owner id: whose record the permits go to (the taking thread or task, as in
--           lua/ since permits became the taking thread's)
-- ARGV[8]   waiter id: the thread (or task) that waits; named in wake-ups (today = owner)
-- ARGV[9]   entry id: the caller's wake-up hub's (one queue entry per hub: per process, connection
--           pool and event loop)
-- ARGV[10]  ttl, ms (>= 1): the owner's lease on its permits (never shortened)
-- ARGV[11]  permits to take, count (>= 1)
-- ARGV[12]  1 = queue if not granted (or keep the entry's place, re-pointed); 0 = try once
--           2 = as 1, and the entry's wake-up lines go to its list, not its channel (b = 1)
--
-- Strict FIFO (fair = 1): granted when enough permits are free and no live entry is ahead
-- of the caller's; a head that wants more than is free blocks those behind it.
-- Replies: 1 granted (value = the owner's permits, aux = lease ms); 2 adopted a missed
-- hand-over grant to this waiter (nothing added); 3 queued (value = position, aux = ms to
-- the earliest holder lease end); 0 busy (queue = 0); error RLOCKS_SEM_MISMATCH.
-- A semaphore issues no fencing tokens (several holders at once: nothing to fence).
local ctx, i = context('sem')
local a = {owner = str_arg(i, 'owner'), waiter = str_arg(i + 1, 'waiter'),
           entry = str_arg(i + 2, 'entry'), side = 's', ttl = int_arg(i + 3, 'ttl', 1),
           add = int_arg(i + 4, 'permits', 1), reentry = 0,
           queue = int_arg(i + 5, 'queue', 0, 2)}
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_acquire(ctx, a)
