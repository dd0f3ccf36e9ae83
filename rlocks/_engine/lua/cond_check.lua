-- cond_check: a waiter looks whether it was notified, and renews its entry's lease.
-- KEYS[1] C (cond_lib.lua);  ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] lease, ms
-- Replies: '1' notified; '0' still waiting; '-1' its entry is gone (its lease ended).
tidy()
local m, notified = mine()
if m == nil then return reply('-1') end
redis.call('ZADD', C, 'XX', now_ms() + tonumber(ARGV[3]), m)
extend_key(C, tonumber(ARGV[3]))
return reply(notified and '1' or '0')
