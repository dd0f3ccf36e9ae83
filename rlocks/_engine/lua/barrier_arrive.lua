-- barrier_arrive: a party arrives at a Barrier (or re-sends its arrival).
-- KEYS[1] H;  KEYS[2] L (barrier_lib.lua)
-- ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] parties;  ARGV[4] keep, ms
-- ARGV[5] call: this wait's id (the same in every re-send of it)
-- ARGV[6] entry lease, ms: the party's lease, renewed at each look
-- ARGV[7] '1' the barrier has an action, '0' not
-- ARGV[8] action lease, ms: how long the last arriver may run the action
-- Replies (a re-send gets the answer of the state its first send made):
--   '1 <index> 0'  the generation passed (this party came last and there is no action)
--   '1 <index> 1'  this party came last: run the action, then barrier_pass
--   '0 <index>'    arrived; wait (barrier_look)
--   '0 -1'         an action runs: not arrived; send this again when hinted (or soon)
--   '-1 0'         the barrier is broken: not arrived
--   '-4 <parties>' H has another parties count: nothing changed
-- One read of what the arrival depends on (again if tidy changed it).
local FIELDS = {'parties', 'gen', 'n', 'broken', 'act', 'a:' .. ME}
local got = redis.call('HMGET', H, unpack(FIELDS))
if got[1] and tonumber(got[1]) ~= PARTIES then return reply('-4', tonumber(got[1])) end
local changed = tidy()
if changed then got = redis.call('HMGET', H, unpack(FIELDS)) end
local call, lease = ARGV[5], tonumber(ARGV[6])
local v = got[6]
local s, g, i, c = nil, nil, nil, nil
if v then s, g, i, c = parse(v) end
if c == call and s ~= 'q' then
    -- A re-send of an arrival that counted: what became of it.
    if s == 'w' then redis.call('ZADD', L, now_ms() + lease, ME) end
    if changed then settle() end
    if s == 'w' then return reply('0', i) end
    if s == 'a' then return reply('1', i, 1) end
    if s == 'p' or s == 'c' then return reply('1', i, 0) end
    return reply('-1', 0)
end
if v and (s == 'w' or s == 'a') then
    -- An earlier wait of this owner arrived and never left (its break was lost with the
    -- link, or cut by an interrupt): it leaves now, as that break would have done, so it
    -- is never counted twice (nor its action left running): the barrier breaks.
    if got[4] ~= '1' then break_all() end
    got[4] = '1'
end
if got[4] == '1' then
    if v then
        -- (its outcome of an earlier wait is of no use now that it waits again)
        redis.call('HDEL', H, 'a:' .. ME)
        redis.call('ZREM', L, ME)
    end
    settle(true)
    return reply('-1', 0)
end
if got[5] then
    record(ME, 'q', 0, -1, call, lease)
    redis.call('ZADD', L, now_ms() + lease, ME)
    settle(true)
    return reply('0', -1)
end
local gen, index = tonumber(got[2] or '0'), tonumber(got[3] or '0')
if not got[1] then
    redis.call('HSET', H, 'parties', PARTIES, 'gen', gen)
end
if index + 1 < PARTIES then
    record(ME, 'w', gen, index, call, lease)
    redis.call('HSET', H, 'n', index + 1)
    redis.call('ZADD', L, now_ms() + lease, ME)
    settle(true)
    return reply('0', index)
end
if ARGV[7] == '1' then
    record(ME, 'a', gen, index, call, lease)
    redis.call('HSET', H, 'n', index + 1, 'act', ME)
    redis.call('ZADD', L, now_ms() + tonumber(ARGV[8]), ME)
    settle(true)
    return reply('1', index, 1)
end
-- The last, and no action: the generation passes in this call.
record(ME, 'a', gen, index, call, lease)
pass()
collect()  -- (its answer is this reply)
settle(false)
return reply('1', index, 0)
