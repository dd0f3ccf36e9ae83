-- event_lib: what an Event's scripts share (after lib.lua).
-- KEYS[1] H the flag, HASH: field 'set' = '1' while the Event is set. It exists only
--         while set and never expires (clear() deletes it).
-- KEYS[2] Q the waiters, ZSET: member '<owner>#<wait>' (one per wait() call; <wait>
--         numbers the waits of the process) while it waits, '!<owner>#<wait>' once a
--         set() told it; score = when its entry lease ends (server ms). A waiter renews
--         its lease each time it looks (event_wait), so a dead waiter's entry ends by
--         itself; Q expires with its longest lease and is gone when nobody waits.
-- The mark, not the flag, is what a waiter returns True for when a clear() came before
-- it looked (threading's set-then-clear, gh-57711): the flag may be gone by then.

local H, Q = KEYS[1], KEYS[2]

local function is_set()
    return redis.call('HGET', H, 'set') == '1'
end

-- Drop the entries whose lease ended (their waiters died or stalled).
local function prune()
    redis.call('ZREMRANGEBYSCORE', Q, '-inf', now_ms())
end

-- Hint `member`'s process (channel '<prefix><process>', process = the owner id without
-- its last ':' part) that it should look now; the reply lists it for wake_local.
local function hint(prefix, member)
    local process = string.match(member, '^(.*):[^:]*$')
    redis.call('PUBLISH', prefix .. process, H .. '\n' .. member)
    woken[#woken + 1] = member
end
