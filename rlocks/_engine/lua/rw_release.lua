-- rw_release: give back read or write holds of an RWLock, and wake who may now proceed.
-- (Runs after rw_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the lock's hash
-- KEYS[2]  the readers' wake-up channel
-- KEYS[3]  the writers' wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  side: 'r' or 'w'
-- ARGV[3]  holds to give back, count (>= 1)
-- ARGV[4]  1 = give back every hold of this owner on that side (_release_save);
--          0 = give back ARGV[3] holds
-- ARGV[5]  publish command: 'PUBLISH' or 'SPUBLISH' (chosen by the engine)
--
-- Wake policy: the owner's last write hold publishes "*" (wake everyone) on both
-- channels; the last read hold of the lock, with no writer left, publishes "1" (wake one
-- writer) on the writers' channel.
--
-- Returns {status, value}:
--   {  1, count }  released; count = the owner's holds left on that side
--   { -1, 0 }      this owner holds nothing on that side (lease ended, key deleted):
--                  nothing but dead entries was changed
local owner = ARGV[1]
local side = ARGV[2]
local give = tonumber(ARGV[3])
local everything = tonumber(ARGV[4])
local command = ARGV[5]

local st = load_state(KEYS[1], server_ms())
local held = held_on(st, side, owner)
if held == nil then
    finish(st)
    return {-1, 0}
end
local left = held - give
if left > 0 and everything == 0 then
    redis.call('HSET', KEYS[1], side .. ':' .. owner, left)
    finish(st)
    return {1, left}
end
drop(st, side, owner)
if side == 'w' then
    publish(command, KEYS[2], '*')
    publish(command, KEYS[3], '*')
elseif st.nr == 0 and st.writer == nil then
    publish(command, KEYS[3], '1')
end
finish(st)
return {1, 0}
