-- rw_unclaim: withdraw a writer's claim (it stopped waiting: timeout, error, interrupt).
-- (Runs after rw_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the lock's hash
-- KEYS[2]  the readers' wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  publish command: 'PUBLISH' or 'SPUBLISH' (chosen by the engine)
--
-- When that was the last claim and nobody writes, readers held back by it may go now:
-- publishes "*" on the readers' channel.
--
-- Returns {status, value}:
--   { 1, claims }  claims = live claims left (other waiting writers)
local owner = ARGV[1]
local command = ARGV[2]

local st = load_state(KEYS[1], server_ms())
if st.c[owner] ~= nil then
    drop_claim(st, owner)
    if st.nc == 0 and st.writer == nil then
        publish(command, KEYS[2], '*')
    end
end
finish(st)
return {1, st.nc}
