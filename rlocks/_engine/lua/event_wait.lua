-- event_wait: a waiter asks whether the Event is set or a set() told it; if neither, it
-- registers (first call) or renews (later calls) its entry. Safe to send again: it
-- changes nothing but the entry's lease.
-- KEYS[1] H, KEYS[2] Q (event_lib.lua);  ARGV[1] member '<owner>#<wait>';
-- ARGV[2] entry lease, ms
-- Replies: '1 1' set, or told by a set(): its entry is kept (event_leave ends it);
--          '1 0' set, and it has no entry (none was made);
--          '0' still waiting: its entry lasts ARGV[2] ms from now (made again if its
--          lease had ended).
local member, lease = ARGV[1], tonumber(ARGV[2])
if redis.call('ZSCORE', Q, '!' .. member) then return reply('1', 1) end
if is_set() then
    return reply('1', redis.call('ZSCORE', Q, member) and 1 or 0)
end
enqueue(Q, member, lease)
return reply('0')
