-- rlock_leave: a waiter stops waiting (time-out, cancel, interrupt): its entry leaves the
-- queue in one step, or is re-pointed to the process's next waiter keeping its place.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..4] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[5]   owner id of the leaving waiter
-- ARGV[6]   entry id (the process's wake-up hub's)
-- ARGV[7]   next owner id of this process to wait in the entry's place; '' = none
-- ARGV[8]   holds that next owner wants, count (>= 1; ignored when ARGV[7] = '')
--
-- Replies: 4 the waiter had been handed the lock and not adopted it: given back and
-- passed on at once (value = holds given back); 1 the entry left (value 0) or was
-- re-pointed (value = position); -1 no entry of this waiter (it expired or was granted
-- and adopted). Whatever is free afterwards is handed over (wakes).
local ctx, i = context('rlock')
local l = {owner = str_arg(i, 'owner'), entry = str_arg(i + 1, 'entry'),
           next_owner = str_arg(i + 2, 'next owner', true), next_side = 'x'}
l.waiter = l.owner
l.next_waiter = l.next_owner
l.next_want = 1
if l.next_owner ~= '' then l.next_want = int_arg(i + 3, 'next want', 1) end
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_leave(ctx, l)
