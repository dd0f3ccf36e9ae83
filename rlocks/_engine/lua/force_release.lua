-- force_release: end every hold of a primitive at once (the CLI's `release --force`) and
-- wake its waiters, whose queue is kept in order (a hint: each asks with its own acquire).
--
-- For an operator clearing a primitive whose holder is stuck. Holders still alive find
-- their hold gone at their next renewal or release and report it lost; a semaphore comes
-- back at its initial value.
--
-- KEYS[1]  B  holds hash;  KEYS[2]  Q  queue;  KEYS[3]  L  holder leases
-- ARGV[1]  wake channel prefix
--
-- Replies: '1' released (B and L deleted); '-1' there was no holds hash (or a key of
-- another type: left untouched). Either way the live waiters were woken.
local B, Q, L = KEYS[1], KEYS[2], KEYS[3]
local kind = redis.call('TYPE', B).ok
if kind ~= 'hash' and kind ~= 'none' then return reply('-1') end
local status = '-1'
if kind == 'hash' then
    redis.call('DEL', B, L)
    status = '1'
end
wake(ARGV[1], B, (waiters(Q, nil)))
return reply(status)
