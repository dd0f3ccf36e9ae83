-- rw_renew: extend one owner's lease on one side of an RWLock, if it still holds it.
-- (Runs after rw_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the lock's hash
-- ARGV[1]  owner id
-- ARGV[2]  side: 'r' or 'w'
-- ARGV[3]  lease, ms (> 0): the owner's lease on that side ends at least this long from
--          now (a longer one, set by another object of this owner or an extend, is kept)
--
-- Returns {status, value}:
--   {  1, count }  renewed; count = the owner's holds on that side
--   { -1, 0 }      this owner holds nothing on that side (its lease had ended): lost
local owner = ARGV[1]
local side = ARGV[2]
local lease_ms = tonumber(ARGV[3])

local st = load_state(KEYS[1], server_ms())
local held = held_on(st, side, owner)
if held == nil then
    finish(st)
    return {-1, 0}
end
local ends_at = lease_end(st, side, owner, lease_ms)
redis.call('HSET', KEYS[1], '#' .. side .. ':' .. owner, ends_at)
if side == 'r' then st.r[owner][2] = ends_at else st.wend = ends_at end
finish(st)
return {1, held}
