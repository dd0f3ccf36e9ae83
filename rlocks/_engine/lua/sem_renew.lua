-- sem_renew: extend an owner's lease on its permits, if it still holds any.
-- (Runs after sem_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the semaphore's hash
-- ARGV[1]  owner id
-- ARGV[2]  lease, ms (> 0): the owner's lease ends at least this long from now (a longer
--          one, set by another object of this owner or an extend, is kept)
-- ARGV[3]  initial value, count (>= 0)
-- ARGV[4]  1 = BoundedSemaphore, 0 = Semaphore
--
-- Returns {status, value}:
--   {  1, count }  renewed; count = the owner's permits
--   { -1, 0 }      this owner holds no permits here (its lease had ended): lost
--   error "RLOCKS_SEM_MISMATCH <value> <bounded>"  as for sem_acquire
local owner = ARGV[1]
local lease_ms = tonumber(ARGV[2])

local st, stored_value, stored_bounded = load_state(KEYS[1], server_ms(),
    tonumber(ARGV[3]), tonumber(ARGV[4]))
if st == nil then
    return mismatch(stored_value, stored_bounded)
end
local hold = st.held[owner]
if hold == nil then
    if st.exists then finish(st) end
    return {-1, 0}
end
set_held(st, owner, hold[1], lease_end(st, owner, lease_ms))
finish(st)
return {1, hold[1]}
