-- rw_acquire: take or re-enter one side of an RWLock, or queue for it.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[5]   owner id: the thread (or task); also the waiter named in wake-ups
-- ARGV[6]   entry id: the caller's wake-up hub's (one queue entry per hub: per process, connection
--           pool and event loop)
-- ARGV[7]   side: 'r' (read) or 'w' (write)
-- ARGV[8]   ttl, ms (>= 1): the hold's lease after a direct grant or adoption
-- ARGV[9]   holds to add, count (>= 1)
-- ARGV[10]  1 = the caller believes it holds that side already (re-entry); 0 = not;
--           + 2 when it holds the other side (then an unadopted grant of that side is
--           the caller's: a writer taking the read side; else it is given back first)
-- ARGV[11]  1 = queue if not granted (or keep the entry's place, re-pointed); 0 = try once
--           2 = as 1, and the entry's wake-up lines go to its list, not its channel (b = 1)
--
-- Grants: re-entry of a held side, and read by the writer (downgrade), at once, never
-- queued. Otherwise FIFO by arrival (fair = 1): a writer when nobody holds either side,
-- a reader when nobody writes, and only with no live entry ahead of the caller's. A
-- release hands over to the next writer, or to every reader queued before the next one.
-- Replies: 1 granted (value = holds on that side, aux = lease ms; a fresh hold of that
-- side, a downgrade's read hold included, carries its fencing token); 2
-- adopted a missed hand-over grant (nothing added; token: its own); 3 queued (value = position, aux = ms to the earliest
-- holder lease end); 0 busy (queue = 0); -1 re-entry refused; -2 upgrade refused (the
-- owner reads but does not write: two upgraders would deadlock).
local ctx, i = context('rw')
local a = {owner = str_arg(i, 'owner'), entry = str_arg(i + 1, 'entry'),
           side = side_arg(i + 2, 'side', 'rw'), ttl = int_arg(i + 3, 'ttl', 1),
           add = int_arg(i + 4, 'add', 1), reentry = int_arg(i + 5, 'reentry', 0, 3),
           queue = int_arg(i + 6, 'queue', 0, 2)}
a.waiter = a.owner
a.other = math.floor(a.reentry / 2)
a.reentry = a.reentry % 2
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_acquire(ctx, a)
