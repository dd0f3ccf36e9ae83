-- deadlock_holders: the live holds of one RLock or RWLock, and the queue entry ahead of
-- a waiter's, for the deadlock detector (rlocks/_engine/deadlock.py). Read-only; run only
-- by a wait longer than its deadlock_timeout, never on an acquire's or a release's path.
-- One slot (the four keys share the primitive's hash tag).
--
-- KEYS[1]  holder lease ends, ZSET (queue_lib.lua's L): member = the hold's field in the
--          holds hash (rlock: <owner>; rw: 'r:<owner>' / 'w:<owner>'), score = end (ms)
-- KEYS[2]  the queue, ZSET (queue_lib.lua's Q): entry id -> sequence number
-- KEYS[3]  the entries hash (queue_lib.lua's W): 'e:<entry>' -> JSON {o = owner, s = side}
-- KEYS[4]  entry lease ends, ZSET (queue_lib.lua's T): 'e:<entry>' -> end (ms)
-- ARGV[1]  the waiter's queue entry id (its wake-up hub's), '' = do not look at the
--          queue (a waiter of a fair = 0 primitive is not held back by those queued)
-- "now" is the server's TIME, as the scripts that grant and expire holds use it.
--
-- Returns {holds, ahead}:
--   holds  the members of KEYS[1] whose lease has not ended (score > now), in any order:
--          every hold someone can still count on (a hold whose lease ended is removed
--          by the next script that runs, and blocks nobody). Empty when nobody holds.
--   ahead  {owner, side, its sequence, the waiter's sequence} of the live entry just
--          ahead of ARGV[1]'s in the queue (strict FIFO: ARGV[1]'s entry is granted only
--          after that one was), or {} when ARGV[1] is '', not queued, at the head, or
--          the entry ahead's lease has ended (the next script removes it). Sequences are
--          strings; an entry keeps its sequence while it keeps its place.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holds = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
local ahead = {}
local entry = ARGV[1]
if entry ~= nil and entry ~= '' then
    local rank = redis.call('ZRANK', KEYS[2], entry)
    local mine = tonumber(redis.call('ZSCORE', KEYS[4], 'e:' .. entry))
    if rank and rank > 0 and mine and mine > now then
        local i = rank - 1
        local prev = redis.call('ZRANGE', KEYS[2], i, i, 'WITHSCORES')
        local ends = tonumber(redis.call('ZSCORE', KEYS[4], 'e:' .. prev[1]))
        local raw = redis.call('HGET', KEYS[3], 'e:' .. prev[1])
        if ends and ends > now and raw then
            local e = cjson.decode(raw)
            ahead = {e.o, e.s, prev[2], redis.call('ZSCORE', KEYS[2], entry)}
        end
    end
end
return {holds, ahead}
