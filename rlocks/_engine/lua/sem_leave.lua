-- sem_leave: a waiter stops waiting: its process's entry leaves the queue in one step
-- (smaller requests behind it may be granted at once), or is re-pointed to the
-- process's next waiter keeping its place.
-- (queue_lib.lua is prepended: KEYS, the context ARGV[1..6] and the reply shape are there.)
-- (op_lib.lua follows it: KEYS[8..9] and the op ARGV, sent by the engine right after the
-- context, so every ARGV below is one further on; a re-send is answered from the record.)
--
-- ARGV[7]   owner id (whose record a hand-over grant went to)
-- ARGV[8]   waiter id of the leaving thread (or task)
-- ARGV[9]   entry id (the process's wake-up hub's)
-- ARGV[10]  next waiter id of this process to wait in the entry's place, also the owner
--           its permits will go to; '' = none
-- ARGV[11]  permits that waiter wants, count (>= 1; ignored when ARGV[10] = '')
--
-- Replies: 4 the waiter had been handed permits and not adopted them: given back and
-- passed on (value = permits); 1 left (value 0) or re-pointed (value = position); -1 no
-- entry of this waiter; error RLOCKS_SEM_MISMATCH.
local ctx, i = context('sem')
local l = {owner = str_arg(i, 'owner'), waiter = str_arg(i + 1, 'waiter'),
           entry = str_arg(i + 2, 'entry'), next_waiter = str_arg(i + 3, 'next waiter', true),
           next_side = 's'}
l.next_owner = l.next_waiter
if l.next_waiter ~= '' then l.next_want = int_arg(i + 4, 'next want', 1) end
if bad then return redis.error_reply(bad) end
local err = open(ctx)
if err then return err end
return op_leave(ctx, l)
