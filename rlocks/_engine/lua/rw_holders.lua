-- rw_holders: how many owners hold one side of an RWLock now (for locked()).
-- (Runs after rw_lib.lua, which scripts.load prepends; the hash layout is described there.)
-- Like every rw script it deletes dead entries first; it changes nothing else.
--
-- KEYS[1]  the lock's hash
-- ARGV[1]  side: 'r' or 'w'
--
-- Returns {status, value}:
--   { 1, owners }  owners = live owners holding that side (0 or more; at most 1 for 'w')
local side = ARGV[1]

local st = load_state(KEYS[1], server_ms())
finish(st)
if side == 'r' then
    return {1, st.nr}
end
if st.writer ~= nil then
    return {1, 1}
end
return {1, 0}
