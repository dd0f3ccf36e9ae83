-- sem_lib: helpers shared by every sem_*.lua script. scripts.load prepends this file to
-- each sem_* operation file, so each runs as one script; on its own it does nothing.
--
-- A Semaphore (or BoundedSemaphore) is one hash:
--   <owner>         permits held by <owner> (a thread, or an asyncio task), count
--   #lease:<owner>  end of <owner>'s lease on them, server ms (redis TIME)
--   #free           permits free now, count (threading's Semaphore._value)
--   #value          the initial value, as given by the first user; later users must agree
--   #bounded        1 for a BoundedSemaphore, 0 for a Semaphore; later users must agree
-- Owner ids contain ':' and never start with '#', so they cannot collide with the rest.
--
-- A holder whose lease end has passed is dead: load_state() gives its permits back to
-- #free before a script looks at anything; when bounded, only as far as #free plus the
-- permits live holders keep stays within #value (so #free never exceeds #value, and the
-- permits in circulation do not grow because a process died).
-- finish() keeps the key only while it says something the initial value does not: at
-- rest (no holder, #free = #value) the key is deleted; while the state that would be
-- left once every lease ended is exactly the initial one, the key's PEXPIRE is the latest
-- lease end (so crashed holders leave nothing behind); otherwise (permits released beyond
-- the initial value, or taken without being given back yet) the key has no expiry and
-- dead holders are recovered by the next script that touches it.

local function server_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The live state at server time `now` for a primitive built with (`value`, `bounded`).
-- Returns nil, stored_value, stored_bounded when the stored pair differs (nothing
-- changed). Dead holders are recovered on the way.
--   st.exists, st.value, st.bounded, st.free
--   st.held[owner] = {count, end}, st.nheld = holders, st.total = permits held
local function load_state(key, now, value, bounded)
    local flat = redis.call('HGETALL', key)
    local st = {key = key, now = now, exists = #flat > 0, value = value, bounded = bounded,
                free = value, held = {}, nheld = 0, total = 0}
    local counts, ends = {}, {}
    local stored_value, stored_bounded = nil, nil
    for i = 1, #flat, 2 do
        local field, v = flat[i], flat[i + 1]
        if field == '#free' then
            st.free = tonumber(v)
        elseif field == '#value' then
            stored_value = tonumber(v)
        elseif field == '#bounded' then
            stored_bounded = tonumber(v)
        elseif string.sub(field, 1, 7) == '#lease:' then
            ends[string.sub(field, 8)] = tonumber(v)
        elseif string.sub(field, 1, 1) ~= '#' then
            counts[field] = tonumber(v)
        end
    end
    if st.exists and (stored_value ~= value or stored_bounded ~= bounded) then
        return nil, stored_value or -1, stored_bounded or -1
    end
    local recovered = 0
    for owner, count in pairs(counts) do
        local ends_at = ends[owner]
        if ends_at == nil or ends_at <= now or count <= 0 then
            redis.call('HDEL', key, owner, '#lease:' .. owner)
            if count > 0 then recovered = recovered + count end
        else
            st.held[owner] = {count, ends_at}
            st.nheld = st.nheld + 1
            st.total = st.total + count
        end
        ends[owner] = nil
    end
    for owner, _ in pairs(ends) do
        redis.call('HDEL', key, '#lease:' .. owner)
    end
    if recovered > 0 then
        local free = st.free + recovered
        -- Bounded: what comes back never lifts free + permits held by the living above
        -- the initial value (sem_release refuses a release of nobody's permit that would,
        -- but state left by an older rlocks, which allowed it, may have filled the gap).
        if bounded == 1 then
            free = math.min(free, math.max(st.free, value - st.total))
        end
        st.free = free
    end
    return st
end

-- The error reply for a (value, bounded) mismatch; semaphore.py turns it into ValueError.
local function mismatch(stored_value, stored_bounded)
    return redis.error_reply('RLOCKS_SEM_MISMATCH ' .. string.format('%d', stored_value)
        .. ' ' .. string.format('%d', stored_bounded))
end

-- The later of `owner`'s live lease end and `now + lease_ms`: a grant or renewal never
-- shortens a live hold's lease (another object of the same name, with a longer ttl, may
-- share this owner's permits and renew them less often).
local function lease_end(st, owner, lease_ms)
    local ends_at = st.now + lease_ms
    local hold = st.held[owner]
    if hold ~= nil and hold[2] > ends_at then return hold[2] end
    return ends_at
end

local function set_held(st, owner, count, ends_at)
    local previous = st.held[owner]
    if previous ~= nil then
        st.total = st.total - previous[1]
        st.nheld = st.nheld - 1
        st.held[owner] = nil
    end
    if count > 0 then
        redis.call('HSET', st.key, owner, count, '#lease:' .. owner, ends_at)
        st.held[owner] = {count, ends_at}
        st.nheld = st.nheld + 1
        st.total = st.total + count
    else
        redis.call('HDEL', st.key, owner, '#lease:' .. owner)
    end
end

local function finish(st)
    if st.nheld == 0 and st.free == st.value then
        redis.call('DEL', st.key)
        return
    end
    redis.call('HSET', st.key, '#free', string.format('%d', st.free),
        '#value', string.format('%d', st.value), '#bounded', st.bounded)
    local after = st.free + st.total
    if st.bounded == 1 and after > st.value then after = st.value end
    if st.nheld > 0 and after == st.value then
        local latest = 0
        for _, hold in pairs(st.held) do
            if hold[2] > latest then latest = hold[2] end
        end
        redis.call('PEXPIRE', st.key, latest - st.now)
    else
        redis.call('PERSIST', st.key)
    end
end

-- ms until the earliest holder's lease ends (at least 1); -1 when nobody holds.
local function ms_until_recovery(st)
    local earliest = nil
    for _, hold in pairs(st.held) do
        if earliest == nil or hold[2] < earliest then earliest = hold[2] end
    end
    if earliest == nil then return -1 end
    return math.max(1, earliest - st.now)
end

