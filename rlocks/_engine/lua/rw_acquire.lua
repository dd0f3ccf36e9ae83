-- rw_acquire: take or re-enter one side of an RWLock for one owner.
--
-- KEYS[1]  B;  KEYS[2]  Q;  KEYS[3]  L (rw_lib.lua);  KEYS[4]  F  fencing token counter
-- ARGV[1]  owner id
-- ARGV[2]  side: 'r' or 'w'
-- ARGV[3]  ttl, ms;  ARGV[4]  count the caller believes the owner holds on that side
-- ARGV[5]  fair '1' / '0';  ARGV[6]  entry lease, ms (0 = just try)
-- ARGV[7]  wake channel prefix (readers let in with a reader);  ARGV[8]  patience, ms
--
-- Replies: as rlock_acquire.lua ('1 <count> <token>', '2 <count> <token>', '0 <ms>',
-- '-1'), and '-2': the write side asked by an owner that reads (an upgrade) and does not
-- write: refused, nothing changed. A reader may always take the read side while it
-- writes (a downgrade), whoever waits.
local B, Q, L, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, side = ARGV[1], ARGV[2]
local ttl, expect = tonumber(ARGV[3]), tonumber(ARGV[4])
local fair, entry_ms = ARGV[5] == '1', tonumber(ARGV[6])
local field = side .. ':' .. owner

local function grant()
    local t = token(F)
    redis.call('HSET', B, field, 1, '#t', ttl)  -- '#t': the lease length (rw_lib.lua)
    if side == 'w' then
        redis.call('HSET', B, '#w', owner)
    else
        redis.call('HINCRBY', B, '#r', 1)
    end
    lease(field, ttl)
    return t
end

if redis.call('EXISTS', B, Q) == 0 then
    if expect ~= 0 then return reply('-1') end
    return reply('1 1', grant())
end

purge()
local count = tonumber(redis.call('HGET', B, field) or '0')
if count > 0 or expect > 0 then
    if count == expect then
        redis.call('HINCRBY', B, field, 1)
        lease(field, ttl)
        return reply('1', count + 1, 0)
    end
    if count == expect + 1 then
        if count == 1 then return reply('2 1', token(F)) end
        return reply('2', count, 0)
    end
    return reply('-1')
end

local w = writer()
if side == 'w' and w ~= owner and redis.call('HEXISTS', B, 'r:' .. owner) == 1 then
    return reply('-2')
end
if side == 'r' and w == owner then
    return reply('1 1', grant())  -- a downgrade: the writer reads too, whoever waits
end

local list, mine = waiters(Q, owner)
local free
if side == 'w' then free = w == false and readers() == 0 else free = w == false end
if free then
    local ok = not fair and patience_running(Q)
    if not ok then
        -- First come, first served: a writer at the head; a reader with no writer
        -- queued before it.
        if side == 'w' then
            ok = list[1] == nil or list[1] == mine
        else
            ok = true
            for _, m in ipairs(list) do
                if m == mine then break end
                if side_of(m) == 'w' then ok = false; break end
            end
        end
    end
    if ok then
        if mine ~= nil then served(Q, mine, #list - 1) end
        local t = grant()
        if side == 'r' then
            -- Readers queued right behind it may come in too.
            local rest = {}
            for _, m in ipairs(list) do
                if m ~= mine then rest[#rest + 1] = m end
            end
            local others = {}
            for _, m in ipairs(servable(rest)) do
                if owner_of(m) ~= owner then others[#others + 1] = m end
            end
            wake(ARGV[7], B, others)
        end
        return reply('1 1', t)
    end
end
local retry
local first = redis.call('ZRANGE', L, 0, 0, 'WITHSCORES')
if not free and first[2] then
    retry = tonumber(first[2]) - now_ms()
elseif list[1] then
    retry = tonumber(redis.call('ZSCORE', Q, list[1])) - now_ms()
else
    retry = entry_ms
end
if entry_ms > 0 then
    enqueue(Q, mine or new_member(side, owner), entry_ms)
end
return reply('0', ask_again(Q, fair, retry))
