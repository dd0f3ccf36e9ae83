-- cond_notify: wake the oldest waiters of the condition, in every process.
--
-- KEYS[1]  the queue (see cond_lib.lua)
-- KEYS[2]  the leases
-- ARGV[1]  how many to notify, count (>= 1); -1 = all (notify_all)
-- ARGV[2]  wake-up channel prefix
-- ARGV[3]  'PUBLISH' or 'SPUBLISH'
--
-- Entries whose lease ended are dropped first, so no notification goes to a dead waiter.
--
-- Returns 'status value' (scripts.py's one reply contract):
--   '1 n'  n = entries notified (0: nobody was waiting)
local n = tonumber(ARGV[1])
local prefix = ARGV[2]
local publish = ARGV[3]

pruned(prefix, publish)
local notified = notify(KEYS[1], n, prefix, publish)
keep_alive(KEYS[1], KEYS[2])
return answer(1, notified)
