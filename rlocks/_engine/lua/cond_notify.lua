-- cond_notify: notify the n oldest waiters of a Condition (0 = all).
-- KEYS[1] C (cond_lib.lua);  ARGV[1] owner (unused);  ARGV[2] wake prefix;  ARGV[3] n
-- Replies: '1 <count>' the number notified.
tidy()
local n = tonumber(ARGV[3])
return reply('1', notify(n > 0 and n or nil))
