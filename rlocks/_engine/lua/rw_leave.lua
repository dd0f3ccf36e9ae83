-- rw_leave: a waiter stops waiting: its entry leaves the queue in one step (readers
-- behind a leaving writer may be granted at once), or is re-pointed keeping its place.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[5]   owner id of the leaving waiter
-- ARGV[6]   entry id (the process's wake-up hub's)
-- ARGV[7]   next owner id of this process to wait in the entry's place; '' = none
-- ARGV[8]   that owner's side: 'r' or 'w' (ignored when ARGV[7] = '')
-- ARGV[9]   holds it wants, count (>= 1; ignored when ARGV[7] = '')
--
-- Replies: 4 passed on a hand-over grant the waiter had not adopted (value = holds);
-- 1 left (value 0) or re-pointed (value = position); -1 no entry of this waiter.
local ctx, i = context('rw')
local l = {owner = str_arg(i, 'owner'), entry = str_arg(i + 1, 'entry'),
           next_owner = str_arg(i + 2, 'next owner', true)}
l.waiter = l.owner
l.next_waiter = l.next_owner
if l.next_owner ~= '' then
    l.next_side = side_arg(i + 3, 'next side', 'rw')
    l.next_want = int_arg(i + 4, 'next want', 1)
end
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_leave(ctx, l)
