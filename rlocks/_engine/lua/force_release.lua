-- force_release: end every hold of a primitive at once (the CLI's `release --force`).
--
-- For an operator clearing a lock whose holder is stuck: it does not ask who holds what.
-- Holders still alive find their hold gone at their next renewal or release and report it
-- lost (LockLostError, on_lost); a semaphore comes back at its initial value.
--
-- KEYS[1]     the primitive's hash (any kind: rlock, rw, sem)
-- KEYS[2..n]  every wake-up channel of that primitive (an RWLock has two); passed as
--             KEYS so a cluster routes the script to their common hash-tag slot
-- ARGV[1]     publish command: 'PUBLISH' or 'SPUBLISH' (chosen by the engine, never user input)
--
-- Returns {status, value}:
--   {  1, 0 }  released: the hash was deleted, and "*" (wake every waiter) was published
--              on each channel, so waiters try again now instead of at the lease's end
--   { -1, 0 }  nothing to release: no such key, or a key that is not a hash (not an
--              rlocks primitive; left untouched). Nothing was published.
local command = ARGV[1]

if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
    return {-1, 0}
end
redis.call('DEL', KEYS[1])
for i = 2, #KEYS do
    if command == 'SPUBLISH' then
        redis.call('SPUBLISH', KEYS[i], '*')
    else
        redis.call('PUBLISH', KEYS[i], '*')
    end
end
return {1, 0}
