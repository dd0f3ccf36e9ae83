-- sem_release: give permits back to a (Bounded)Semaphore and wake as many waiters as
-- are free to be served.
--
-- KEYS[1]  B;  KEYS[2]  Q;  KEYS[3]  L (sem_lib.lua)
-- ARGV[1]  the releasing owner id;  ARGV[2]  wake channel prefix
-- ARGV[3]  initial value;  ARGV[4]  1 bounded / 0 not
-- ARGV[5]  permits released (>= 1)
-- ARGV[6]  fair '1' / '0';  ARGV[7]  patience, ms
-- ARGV[8], ARGV[9], ARGV[10], ...  triples (owner, permits it holds before this call,
--          permits taken off it): the releasing thread's first, then other threads' of
--          its process, as the engine chose from its books; the takes sum to at most
--          ARGV[5]. The rest is a release of nobody's permit: it adds to the value of a
--          Semaphore, and a BoundedSemaphore refuses it (it would put more than its value
--          in circulation). The releasing owner's own count must be as listed (a re-send
--          is recognised by it); another owner's need only cover what is taken.
--
-- Replies:
--   '1 <free>'   released; free = permits free now
--   '2 <free>'   this very call had been applied already (a re-send): nothing changed
--   '-1 <i>'     the owner of triple i (1-based) holds other than listed (its lease
--                ended): nothing changed
--   '-3'         a BoundedSemaphore would exceed its value: nothing changed
--   '-4 <value> <bounded>'  as sem_acquire.lua
local B, Q, L = KEYS[1], KEYS[2], KEYS[3]
local value, bounded, give = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local bad = mismatch(value, bounded)
if bad then return bad end
purge()
local takes, taken, applied, fresh = {}, 0, 0, 0
for j = 8, #ARGV - 2, 3 do
    local o, had, take = ARGV[j], tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
    local now = tonumber(redis.call('HGET', B, o) or '0')
    if o ~= ARGV[1] then
        -- Another thread's permits: it may have taken more meanwhile (its books and this
        -- thread's are apart), so only enough are asked for.
        if now < take then return reply('-1', #takes + 1) end
        fresh = fresh + 1
    elseif now == had then
        fresh = fresh + 1
    elseif now == had - take and now > 0 then
        applied = applied + 1
    else
        -- (None left where its last ones were listed: released by a first send of this
        -- very call, or lost; the caller, who knows whether it sent it twice, decides.)
        return reply('-1', #takes + 1)
    end
    takes[#takes + 1] = {o, take}
    taken = taken + take
end
if applied > 0 and fresh == 0 then return reply('2', free(value)) end
if applied > 0 then return reply('-1', 1) end
local rest = give - taken
if rest > 0 then
    if bounded == 1 then return reply('-3') end
    if redis.call('EXISTS', B) == 0 then
        redis.call('HSET', B, '#i', value, '#b', bounded, '#v', value, '#h', 0)
    end
    redis.call('HINCRBY', B, '#v', rest)
end
for _, t in ipairs(takes) do
    if redis.call('HINCRBY', B, t[1], -t[2]) <= 0 then
        redis.call('HDEL', B, t[1])
        redis.call('ZREM', L, t[1])
    end
    redis.call('HINCRBY', B, '#h', -t[2])
end
local n = free(value)
settle(nil)
if redis.call('EXISTS', Q) == 1 then
    wake_heads(ARGV[2], B, Q, servable(waiters(Q, nil)), ARGV[6] == '1', tonumber(ARGV[7]))
end
return reply('1', n)
