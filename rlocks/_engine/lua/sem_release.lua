-- sem_release: give permits back to a (Bounded)Semaphore and wake that many waiters.
-- (Runs after sem_lib.lua, which scripts.load prepends; the hash layout is described there.)
--
-- KEYS[1]  the semaphore's hash
-- KEYS[2]  its wake-up channel
-- ARGV[1]  permits released, count (>= 1): added to #free, as threading.Semaphore does
-- ARGV[2]  initial value, count (>= 0), as given to the constructor
-- ARGV[3]  1 = BoundedSemaphore, 0 = Semaphore
-- ARGV[4]  publish command: 'PUBLISH' or 'SPUBLISH' (chosen by the engine)
-- ARGV[5], ARGV[6], ...  pairs (owner id, count >= 1): permits taken off each owner's own
--          record (the releasing thread's first, then other threads of its process, as
--          semaphore.py chose from its local books); their counts sum to at most ARGV[1].
--          The rest of ARGV[1] is a release by nobody's permit (threading's counter model).
--
-- Returns {status, value}:
--   {  1, free }  released; free = permits free now. ARGV[1] is published (wake that
--                 many waiters per process).
--   {  0, -1 }    refused: a BoundedSemaphore would have more permits in circulation
--                 (free plus held by live owners) than its initial value; nothing was
--                 changed
--   { -1, i }     refused: the owner of pair i (1-based) holds fewer permits than listed
--                 (its lease ended and they were given back already, or the key was
--                 deleted); nothing was changed
--   error "RLOCKS_SEM_MISMATCH <value> <bounded>"  as for sem_acquire
local give = tonumber(ARGV[1])
local command = ARGV[4]
local takes = {}
local owned = 0
for i = 5, #ARGV - 1, 2 do
    local n = tonumber(ARGV[i + 1])
    takes[#takes + 1] = {ARGV[i], n}
    owned = owned + n
end

local st, stored_value, stored_bounded = load_state(KEYS[1], server_ms(),
    tonumber(ARGV[2]), tonumber(ARGV[3]))
if st == nil then
    return mismatch(stored_value, stored_bounded)
end
for i, take in ipairs(takes) do
    local hold = st.held[take[1]]
    if hold == nil or hold[1] < take[2] then
        if st.exists then finish(st) end
        return {-1, i}
    end
end
-- Permits given back by their holders only move from held to free; the rest would add
-- permits to circulation, which a BoundedSemaphore never lets exceed its value.
if st.bounded == 1 and st.free + st.total + (give - owned) > st.value then
    if st.exists then finish(st) end
    return {0, -1}
end
st.free = st.free + give
for _, take in ipairs(takes) do
    local hold = st.held[take[1]]
    set_held(st, take[1], hold[1] - take[2], hold[2])
end
finish(st)
if command == 'SPUBLISH' then
    redis.call('SPUBLISH', KEYS[2], give)
else
    redis.call('PUBLISH', KEYS[2], give)
end
return {1, st.free}
