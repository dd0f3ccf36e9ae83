-- sem_release: give permits back to a (Bounded)Semaphore and wake that many waiters.
-- (Runs after sem_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the semaphore's hash
-- KEYS[2]  its wake-up channel
-- ARGV[1]  owner id (the releasing process)
-- ARGV[2]  permits released, count (>= 1): added to #free, as threading.Semaphore does
-- ARGV[3]  of those, how many to take off this owner's own record, count (0..ARGV[2]):
--          the permits this process knows it holds (semaphore.py reserves them locally)
-- ARGV[4]  initial value, count (>= 0), as given to the constructor
-- ARGV[5]  1 = BoundedSemaphore, 0 = Semaphore
-- ARGV[6]  publish command: 'PUBLISH' or 'SPUBLISH' (chosen by the engine)
--
-- Returns {status, value}:
--   {  1, free }  released; free = permits free now. ARGV[2] is published (wake that
--                 many waiters per process).
--   {  0, -1 }    refused: a BoundedSemaphore would go above its initial value; nothing
--                 was changed
--   { -1, 0 }     refused: this owner holds fewer than ARGV[3] permits here (its lease
--                 ended and they were already given back); nothing was changed
--   error "RLOCKS_SEM_MISMATCH <value> <bounded>"  as for sem_acquire
local owner = ARGV[1]
local give = tonumber(ARGV[2])
local own = tonumber(ARGV[3])
local command = ARGV[6]

local st, stored_value, stored_bounded = load_state(KEYS[1], server_ms(),
    tonumber(ARGV[4]), tonumber(ARGV[5]))
if st == nil then
    return mismatch(stored_value, stored_bounded)
end
local hold = st.held[owner]
local held = 0
if hold ~= nil then held = hold[1] end
if held < own then
    if st.exists then finish(st) end
    return {-1, 0}
end
if st.bounded == 1 and st.free + give > st.value then
    if st.exists then finish(st) end
    return {0, -1}
end
st.free = st.free + give
if own > 0 then
    set_held(st, owner, held - own, hold[2])
end
finish(st)
if command == 'SPUBLISH' then
    redis.call('SPUBLISH', KEYS[2], give)
else
    redis.call('PUBLISH', KEYS[2], give)
end
return {1, st.free}
