-- rlock_renew: make an owner's RLock hold last at least ttl more (renewal, extend()).
--
-- KEYS[1]  B  holds hash
-- ARGV[1]  owner id;  ARGV[2]  ttl, ms
--
-- Replies: '1' renewed (a longer lease left is kept); '-1' the owner holds nothing.
local B = KEYS[1]
if redis.call('HEXISTS', B, ARGV[1]) == 0 then return reply('-1') end
extend_key(B, tonumber(ARGV[2]))
return reply('1')
