-- sem_renew: make an owner's permits last at least ttl more.
--
-- KEYS[1]  B;  KEYS[2]  Q (unused);  KEYS[3]  L (sem_lib.lua)
-- ARGV[1]  owner id;  ARGV[2]  ttl, ms
--
-- Replies: '1' renewed (a longer lease left is kept); '-1' the owner holds no permit.
purge()
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return reply('-1') end
lease(ARGV[1], tonumber(ARGV[2]))
return reply('1')
