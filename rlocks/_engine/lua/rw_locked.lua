-- rw_locked: how many owners hold one side of an RWLock now (read only).
-- (after lib.lua)
-- KEYS[1] B (unused);  KEYS[2] Q (unused);  KEYS[3] L (rw_lib.lua)
-- ARGV[1] side 'r' / 'w'
-- Replies: '1 <owners>'.
local n = 0
for _, f in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now_ms(), '+inf')) do
    if string.sub(f, 1, 1) == ARGV[1] then n = n + 1 end
end
return reply('1', n)
