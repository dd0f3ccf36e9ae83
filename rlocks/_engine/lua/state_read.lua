-- state_read: one primitive's keys as they are at one server time (a read: changes nothing).
-- The CLI and statistics() read with it: one atomic step, on whichever node holds the
-- primitive's slot.
--
-- KEYS[1]  B  holds hash;  KEYS[2]  Q  queue;  KEYS[3]  L  holder leases
-- ARGV[]   none
--
-- Replies: { TIME seconds, TIME microseconds, B's fields and values (flat), B's PTTL,
--            L's members and scores (flat), Q's members and scores (flat) }
-- A key of another type under our name reads as absent (false), not as an error.
local B, Q, L = KEYS[1], KEYS[2], KEYS[3]
local function read(key, want, ...)
    if redis.call('TYPE', key).ok ~= want then return false end
    return redis.call(...)
end
local now = redis.call('TIME')
return { now[1], now[2],
         read(B, 'hash', 'HGETALL', B),
         redis.call('PTTL', B),
         read(L, 'zset', 'ZRANGE', L, 0, -1, 'WITHSCORES'),
         read(Q, 'zset', 'ZRANGE', Q, 0, -1, 'WITHSCORES') }
