-- cond_lib: helpers shared by every cond_*.lua script. scripts.load prepends this file to
-- each cond_* operation file, so each runs as one script; on its own it does nothing.
--
-- A Condition is two sorted sets in its lock's hash tag (one cluster slot):
--   KEYS[1]  the queue:  member = waiter entry id, score = arrival number (oldest lowest)
--   KEYS[2]  the leases: member = waiter entry id, score = end of its lease, server ms
-- An entry in both sets is WAITING; in the leases only, NOTIFIED (its waiter has not
-- taken the lock back yet: it may have looked, but it has not used the notification); in
-- neither, GONE. So the queue is always a subset of the leases, and a key that is empty
-- does not exist. Removing an entry from the queue IS the notification: the published
-- message only makes the waiter look sooner. A NOTIFIED entry ends only when its waiter
-- holds the lock again (cond_done), or passes it on (cond_leave), or its lease ends (then
-- prune passes it on): so a waiter that dies anywhere before its wait returns leaves the
-- notification to the next waiter.
--
-- An entry id is "<owner>/<serial>"; the waiter listens on the channel
-- <channel prefix> .. <owner> (each thread or task waits on one thing at a time).
--
-- Replies follow the one reply contract of scripts.py, in its short form 'status value'
-- (see answer), with three statuses said of the caller's entry: 1 notified (or done),
-- 0 still waiting, -1 gone.

-- The reply: 'status value', two integers in one line of text (scripts.py's contract; a
-- text reply is one element for the client to parse, where a table is one per value).
local function answer(status, value)
    return string.format('%d %d', status, value)
end

local function server_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function channel_of(prefix, entry)
    return prefix .. string.match(entry, '^(.*)/[^/]*$')
end

-- Notify the `n` oldest waiting entries (n < 0: all of them): each leaves the queue and
-- keeps its lease until its waiter takes the news. Returns how many were notified.
local function notify(queue, n, prefix, publish)
    if n == 0 then
        return 0
    end
    local picked = redis.call('ZRANGE', queue, 0, n < 0 and -1 or n - 1)
    for _, entry in ipairs(picked) do
        redis.call('ZREM', queue, entry)
        redis.call(publish, channel_of(prefix, entry), '1')
    end
    return #picked
end

-- Delete the entries whose lease ended before `now` (their waiter died or stalled). A dead
-- WAITING entry just goes; a dead NOTIFIED entry's notification is passed on to the
-- oldest live waiter, so a notification is never spent on a dead waiter.
local function prune(queue, leases, now, prefix, publish)
    local dead = redis.call('ZRANGEBYSCORE', leases, '-inf', '(' .. now)
    local passed = 0
    for _, entry in ipairs(dead) do
        if redis.call('ZREM', queue, entry) == 0 then
            passed = passed + 1
        end
        redis.call('ZREM', leases, entry)
    end
    if passed > 0 then
        notify(queue, passed, prefix, publish)
    end
end

-- What every cond_* script does first: prune the condition's KEYS (see prune); returns
-- the server time it pruned at (ms).
local function pruned(prefix, publish)
    local now = server_ms()
    prune(KEYS[1], KEYS[2], now, prefix, publish)
    return now
end

-- Both keys expire with the latest lease, so a condition whose waiters all died vanishes.
local function keep_alive(queue, leases)
    local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
    if #last > 0 then
        local at = tonumber(last[2]) + 1
        redis.call('PEXPIREAT', leases, at)
        redis.call('PEXPIREAT', queue, at)
    end
end
