-- rlock_lib: what an RLock's scripts share (after lib.lua).
-- KEYS[1] B holds hash (<owner> -> count; its PEXPIRE is the lease), KEYS[2] Q queue.

-- The waiters (of `list`, in arrival order) the lock can serve now: the head, if free.
local function servable(list)
    if #list == 0 or redis.call('EXISTS', KEYS[1]) == 1 then return {} end
    return {list[1]}
end
