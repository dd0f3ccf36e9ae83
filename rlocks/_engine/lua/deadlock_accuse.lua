-- deadlock_accuse: leave the victim of a confirmed deadlock cycle an accusation, for when
-- its own walk cannot reach back through the cycle (rlocks/_engine/deadlock.py, "A
-- victim another member found"). Run only by a wait longer than its deadlock_timeout that
-- found and confirmed a cycle whose victim is another wait. One slot: both keys carry
-- the victim's owner as their hash tag.
--
-- KEYS[1]  the victim's wait-for edge ('<ns>:wait:{<owner>}'): '<seq> <side> <entry> <key>'
-- KEYS[2]  its accusation ('<ns>:accuse:{<owner>}')
-- ARGV[1]  the victim wait's seq (decimal), as the accuser read and confirmed it
-- ARGV[2]  the accusation: the cycle, as deadlock.py writes and reads it
--
-- Written only while that very wait's edge is there (same seq), and it expires with that
-- edge's lease: a wait that ended (its edge deleted together with the accusation) or a
-- later wait of the same owner (another seq) is never accused by a late accuser.
-- Returns 1 written, 0 not (the edge is gone or is another wait's). Outside the reply
-- contract of the operation scripts, like deadlock_holders.lua.
local edge = redis.call('GET', KEYS[1])
if not edge or string.match(edge, '^(%d+) ') ~= ARGV[1] then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ttl)
return 1
