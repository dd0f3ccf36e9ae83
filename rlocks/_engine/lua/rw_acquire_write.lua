-- rw_acquire_write: take, or re-enter, the write side of an RWLock.
-- (Runs after rw_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the lock's hash
-- ARGV[1]  owner id (opaque string)
-- ARGV[2]  lease, ms (> 0): the owner's write lease (and a waiting claim) lasts this long
--          (a re-entry never shortens a longer write lease; see lease_end in rw_lib)
-- ARGV[3]  write holds to add, count (>= 1)
-- ARGV[4]  1 = the caller will wait: when busy, stake (or refresh) this owner's claim, so
--          new readers wait behind it; 0 = a single try: never claim
-- ARGV[5]  1 = the caller believes this owner already writes (re-entry); 0 = not
--
-- Granted when nobody else holds either side. An owner that reads without writing is
-- refused (upgrade would deadlock two upgraders; rwlock.py refuses it before asking).
-- A grant removes the owner's own claim.
--
-- Returns {status, value}:
--   { 1, count }  granted; count = the owner's write holds now
--   { 0, ms }     held by others; ms = time until the earliest blocking lease ends, at
--                 most half the lease, so a waiter refreshes its claim before it ends
--   {-1, 0 }      refused: this owner holds the read side only (upgrade), or, with
--                 ARGV[5] = 1, its write hold is gone (lease ended unnoticed); nothing
--                 was changed
local owner = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local add = tonumber(ARGV[3])
local claim = tonumber(ARGV[4])
local reentry = tonumber(ARGV[5])

local st = load_state(KEYS[1], server_ms())
if reentry == 1 and st.writer ~= owner then
    finish(st)
    return {-1, 0}
end
if st.writer == owner then
    local count = grant(st, 'w', owner, add, lease_ms)
    finish(st)
    return {1, count}
end
if st.r[owner] ~= nil then
    finish(st)
    return {-1, 0}
end
if st.writer ~= nil or st.nr > 0 then
    local blockers = {}
    if st.writer ~= nil then blockers[#blockers + 1] = st.wend end
    for _, hold in pairs(st.r) do blockers[#blockers + 1] = hold[2] end
    if claim == 1 then
        set_claim(st, owner, st.now + lease_ms)
    end
    finish(st)
    return {0, math.min(ms_until_earliest(st, blockers), math.max(1, math.floor(lease_ms / 2)))}
end
drop_claim(st, owner)
local count = grant(st, 'w', owner, add, lease_ms)
finish(st)
return {1, count}
