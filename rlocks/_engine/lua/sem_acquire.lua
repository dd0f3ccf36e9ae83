-- sem_acquire: take permits of a (Bounded)Semaphore for an owner (a thread or task).
-- (Runs after sem_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the semaphore's hash
-- ARGV[1]  owner id (opaque string; the taking thread's or task's owner id)
-- ARGV[2]  lease, ms (> 0): the owner's lease on all its permits ends this long from now,
--          or later if it already did (never shortened; see lease_end in sem_lib)
-- ARGV[3]  permits to take, count (>= 1)
-- ARGV[4]  initial value, count (>= 0), as given to the constructor
-- ARGV[5]  1 = BoundedSemaphore, 0 = Semaphore
--
-- Returns {status, value}:
--   { 1, count }  granted; count = the owner's permits now
--   { 0, ms }     not enough free permits; ms = time until the earliest holder's lease
--                 ends (its permits may come back then), -1 when nobody holds any
--   error "RLOCKS_SEM_MISMATCH <value> <bounded>"  the hash was made with another initial
--                 value or kind (shown); nothing was changed
local owner = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local take = tonumber(ARGV[3])

local st, stored_value, stored_bounded = load_state(KEYS[1], server_ms(),
    tonumber(ARGV[4]), tonumber(ARGV[5]))
if st == nil then
    return mismatch(stored_value, stored_bounded)
end
if st.free < take then
    if st.exists then finish(st) end
    return {0, ms_until_recovery(st)}
end
st.free = st.free - take
local count = take
if st.held[owner] ~= nil then count = count + st.held[owner][1] end
set_held(st, owner, count, lease_end(st, owner, lease_ms))
finish(st)
return {1, count}
