-- leave: a waiter stops waiting (time-out, cancel, error): its queue entry goes, and if
-- that lets someone else be served now (it was at the head), they are woken.
-- (after lib.lua and the kind's lib, whose servable() decides who can be served)
--
-- KEYS[1]  B  holds hash;  KEYS[2]  Q  queue;  KEYS[3]  L  holder leases (rw, sem; else
--          unused)
-- ARGV[1]  owner id;  ARGV[2]  wake channel prefix;  ARGV[3]  value (sem), else unused
--
-- Replies: '1' left; '0' it was not queued (its entry had ended).
local B, Q = KEYS[1], KEYS[2]
local list, mine = waiters(Q, ARGV[1])
if mine == nil then return reply('0') end
local rest = {}
for _, m in ipairs(list) do
    if m ~= mine then rest[#rest + 1] = m end
end
served(Q, mine, #rest)
wake(ARGV[2], B, servable(rest))
return reply('1')
