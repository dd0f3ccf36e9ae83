-- rlock_acquire: take or re-enter an exclusive reentrant lock, or queue for it.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[5]   owner id: the thread (or task) that takes the lock; it is also the waiter
--           named in wake-ups
-- ARGV[6]   entry id: the caller's wake-up hub's (one queue entry per hub: per process, connection
--           pool and event loop)
-- ARGV[7]   ttl, ms (>= 1): the hold's lease after a direct grant or adoption
-- ARGV[8]   holds to add, count (>= 1): 1 for acquire(), n for _acquire_restore()
-- ARGV[9]   1 = the caller believes it holds the lock already (re-entry); 0 = not
-- ARGV[10]  1 = queue if not granted (or keep the entry's place, re-pointed to this
--           owner); 0 = a single try, nothing queued
--           2 = as 1, and the entry's wake-up lines go to its list, not its channel (b = 1)
--
-- Replies: 1 granted (value = holds, aux = lease ms; a fresh hold carries
-- its fencing token; re-entry: token 0); 2 adopted a hand-over grant to this owner it
-- had not seen (nothing added; token: the grant's); 3 queued (value = position, aux = ms to the
-- holder's lease end); 0 busy (queue = 0); -1 re-entry refused (the hold is gone).
-- Re-entry is granted at once, never queued. fair = 1: granted only when free and no
-- other live entry is ahead of the caller's.
local ctx, i = context('rlock')
local a = {owner = str_arg(i, 'owner'), entry = str_arg(i + 1, 'entry'), side = 'x',
           ttl = int_arg(i + 2, 'ttl', 1), add = int_arg(i + 3, 'add', 1),
           reentry = int_arg(i + 4, 'reentry', 0, 1), queue = int_arg(i + 5, 'queue', 0, 2)}
a.waiter = a.owner
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_acquire(ctx, a)
