-- rw_renew: make an owner's hold of one RWLock side last at least ttl more.
--
-- KEYS[1]  B;  KEYS[2]  Q (unused);  KEYS[3]  L (rw_lib.lua)
-- ARGV[1]  owner id;  ARGV[2]  side 'r' / 'w';  ARGV[3]  ttl, ms
--
-- Replies: '1' renewed (a longer lease left is kept); '-1' the owner holds nothing there.
local field = ARGV[2] .. ':' .. ARGV[1]
purge()
if redis.call('HEXISTS', KEYS[1], field) == 0 then return reply('-1') end
lease(field, tonumber(ARGV[3]))
return reply('1')
