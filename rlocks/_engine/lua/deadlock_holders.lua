-- deadlock_holders: the live holds of one RLock or RWLock, for the deadlock detector
-- (rlocks/_engine/deadlock.py). Read-only; run only by a wait longer than its
-- deadlock_timeout, never on an acquire's or a release's path. One slot.
--
-- KEYS[1]  holder lease ends, ZSET (queue_lib.lua's L): member = the hold's field in the
--          holds hash (rlock: <owner>; rw: 'r:<owner>' / 'w:<owner>'), score = end (ms)
-- ARGV[]   none: "now" is the server's TIME, as the scripts that grant and expire holds
--          use it
--
-- Returns the members whose lease has not ended (score > now), in any order: every hold
-- someone can still count on (a hold whose lease ended is removed by the next script
-- that runs, and blocks nobody). Empty when nobody holds.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
