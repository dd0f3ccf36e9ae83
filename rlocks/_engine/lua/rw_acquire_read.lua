-- rw_acquire_read: take, or re-enter, the read side of an RWLock.
-- (Runs after rw_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the lock's hash
-- ARGV[1]  owner id (opaque string)
-- ARGV[2]  lease, ms (> 0): the owner's read lease ends this long after the grant, or
--          later if it already did (never shortened; see lease_end in rw_lib)
-- ARGV[3]  read holds to add, count (>= 1)
-- ARGV[4]  1 = the caller believes this owner already reads (re-entry); 0 = not
--
-- Granted when no other owner holds the write side and no writer is waiting (a live
-- claim). An owner that already reads, or that holds the write side (downgrade), is
-- granted whatever waits: re-entry never blocks on a writer that waits for us.
--
-- Returns {status, value}:
--   { 1, count }  granted; count = the owner's read holds now
--   { 0, ms }     another owner writes, or a writer waits; ms = time until the earliest
--                 blocking lease or claim ends (at least 1)
--   {-1, 0 }      re-entry refused: the owner's read hold is gone (lease ended unnoticed,
--                 key deleted); nothing was changed
local owner = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local add = tonumber(ARGV[3])
local reentry = tonumber(ARGV[4])

local st = load_state(KEYS[1], server_ms())
if reentry == 1 and st.r[owner] == nil then
    -- Granting it as a fresh hold would let an inner release end a hold that an outer
    -- frame still believes it has.
    finish(st)
    return {-1, 0}
end
if st.writer ~= nil and st.writer ~= owner then
    finish(st)
    return {0, ms_until_earliest(st, {st.wend})}
end
if st.r[owner] == nil and st.writer ~= owner and st.nc > 0 then
    local claims = {}
    for _, ends_at in pairs(st.c) do claims[#claims + 1] = ends_at end
    finish(st)
    return {0, ms_until_earliest(st, claims)}
end
local count = grant(st, 'r', owner, add, lease_ms)
finish(st)
return {1, count}
