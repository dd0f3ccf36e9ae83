-- event_clear: clear the Event. Waiters a set() told keep their mark (they still return
-- True); entries whose lease ended go, so a cleared Event nobody waits on keeps no key.
-- Safe to send again.
-- KEYS[1] H, KEYS[2] Q (event_lib.lua);  ARGV[] none
-- Replies: '1' it was set; '0' it was clear already.
local was = redis.call('DEL', H)
if redis.call('EXISTS', Q) == 1 then prune() end
return reply(was == 1 and '1' or '0')
