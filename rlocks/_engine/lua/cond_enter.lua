-- cond_enter: a waiter joins a Condition's queue (while it still holds the lock).
-- KEYS[1] C (cond_lib.lua);  ARGV[1] owner;  ARGV[2] wake prefix;  ARGV[3] lease, ms
-- Replies: '1'.
tidy()
local m = mine()
if m then redis.call('ZREM', C, m) end
redis.call('ZADD', C, now_ms() + tonumber(ARGV[3]), new_member('c', ARGV[1]))
extend_key(C, tonumber(ARGV[3]))
return reply('1')
