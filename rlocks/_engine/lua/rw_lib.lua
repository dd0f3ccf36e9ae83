-- rw_lib: helpers shared by every rw_*.lua script. scripts.load prepends this file to each
-- rw_* operation file, so each runs as one script; on its own it does nothing.
--
-- An RWLock is one hash. Every field names its owner after a one-letter prefix:
--   r:<owner>    read holds of <owner>, count (any number of owners)
--   w:<owner>    write holds of <owner>, count (one owner at most)
--   #r:<owner>   end of <owner>'s read lease, server ms (redis TIME)
--   #w:<owner>   end of <owner>'s write lease, server ms
--   #c:<owner>   a writer waiting for the write side: end of its claim, server ms
-- A hold or claim whose end has passed is dead. load_state() deletes dead entries before
-- a script looks at anything, so one dead reader's lease ends while other readers live
-- (a key-wide PEXPIRE could not do that). finish() keeps the key's PEXPIRE at the latest
-- live end, so a lock whose owners all died disappears by itself, and deletes the key
-- when nothing live is left.

local function server_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The live state of the lock at server time `now`; dead entries are deleted on the way.
--   st.r[owner] = {count, end}, st.nr = number of readers
--   st.writer, st.wcount, st.wend  (nil when no writer)
--   st.c[owner] = end, st.nc = number of claims
local function load_state(key, now)
    local st = {key = key, now = now, r = {}, nr = 0, c = {}, nc = 0}
    local counts = {r = {}, w = {}}
    local ends = {r = {}, w = {}, c = {}}
    local flat = redis.call('HGETALL', key)
    for i = 1, #flat, 2 do
        local field, value = flat[i], tonumber(flat[i + 1])
        local table_for
        if string.sub(field, 1, 1) == '#' then
            table_for = ends[string.sub(field, 2, 2)]
            if table_for and string.sub(field, 3, 3) == ':' then
                table_for[string.sub(field, 4)] = value
            end
        else
            table_for = counts[string.sub(field, 1, 1)]
            if table_for and string.sub(field, 2, 2) == ':' then
                table_for[string.sub(field, 3)] = value
            end
        end
    end
    for side, owners in pairs(counts) do
        for owner, count in pairs(owners) do
            local ends_at = ends[side][owner]
            if ends_at == nil or ends_at <= now or count == nil or count <= 0 then
                redis.call('HDEL', key, side .. ':' .. owner, '#' .. side .. ':' .. owner)
            elseif side == 'r' then
                st.r[owner] = {count, ends_at}
                st.nr = st.nr + 1
            else
                st.writer, st.wcount, st.wend = owner, count, ends_at
            end
            ends[side][owner] = nil
        end
    end
    -- Lease ends without a count (never written by these scripts; tidy anyway).
    for side, owners in pairs({r = ends.r, w = ends.w}) do
        for owner, _ in pairs(owners) do
            redis.call('HDEL', key, '#' .. side .. ':' .. owner)
        end
    end
    for owner, ends_at in pairs(ends.c) do
        if ends_at <= now then
            redis.call('HDEL', key, '#c:' .. owner)
        else
            st.c[owner] = ends_at
            st.nc = st.nc + 1
        end
    end
    return st
end

-- The later of `owner`'s live lease end on `side` and `now + lease_ms`: a grant or renewal
-- never shortens a live hold's lease (another object of the same name, with a longer ttl,
-- may hold outer levels of it and renew it less often).
local function lease_end(st, side, owner, lease_ms)
    local ends_at = st.now + lease_ms
    local current = nil
    if side == 'r' then
        if st.r[owner] ~= nil then current = st.r[owner][2] end
    elseif st.writer == owner then
        current = st.wend
    end
    if current ~= nil and current > ends_at then return current end
    return ends_at
end

-- Add `add` holds of `side` ('r' or 'w') for `owner` and extend its lease to at least
-- `lease_ms` from now; returns the owner's count on that side now.
local function grant(st, side, owner, add, lease_ms)
    local ends_at = lease_end(st, side, owner, lease_ms)
    local count = redis.call('HINCRBY', st.key, side .. ':' .. owner, add)
    redis.call('HSET', st.key, '#' .. side .. ':' .. owner, ends_at)
    if side == 'r' then
        if st.r[owner] == nil then
            st.nr = st.nr + 1
        end
        st.r[owner] = {count, ends_at}
    else
        st.writer, st.wcount, st.wend = owner, count, ends_at
    end
    return count
end

-- How many holds `owner` has on `side` ('r' or 'w'), or nil when it holds none there.
local function held_on(st, side, owner)
    if side == 'r' then
        if st.r[owner] ~= nil then return st.r[owner][1] end
        return nil
    end
    if st.writer == owner then return st.wcount end
    return nil
end

-- Remove every hold of `side` for `owner`.
local function drop(st, side, owner)
    redis.call('HDEL', st.key, side .. ':' .. owner, '#' .. side .. ':' .. owner)
    if side == 'r' then
        if st.r[owner] ~= nil then
            st.r[owner] = nil
            st.nr = st.nr - 1
        end
    elseif st.writer == owner then
        st.writer, st.wcount, st.wend = nil, nil, nil
    end
end

local function set_claim(st, owner, ends_at)
    redis.call('HSET', st.key, '#c:' .. owner, ends_at)
    if st.c[owner] == nil then
        st.nc = st.nc + 1
    end
    st.c[owner] = ends_at
end

local function drop_claim(st, owner)
    if st.c[owner] ~= nil then
        redis.call('HDEL', st.key, '#c:' .. owner)
        st.c[owner] = nil
        st.nc = st.nc - 1
    end
end

-- Key expiry = the latest live end; no live entry left: the key goes.
local function finish(st)
    local latest = nil
    for _, hold in pairs(st.r) do
        if latest == nil or hold[2] > latest then latest = hold[2] end
    end
    if st.wend ~= nil and (latest == nil or st.wend > latest) then latest = st.wend end
    for _, ends_at in pairs(st.c) do
        if latest == nil or ends_at > latest then latest = ends_at end
    end
    if latest == nil then
        redis.call('DEL', st.key)
    else
        redis.call('PEXPIRE', st.key, latest - st.now)
    end
end

-- ms from now until the earliest of `ends` (a list of server-ms ends), at least 1; -1
-- when the list is empty.
local function ms_until_earliest(st, ends)
    local earliest = nil
    for _, ends_at in ipairs(ends) do
        if earliest == nil or ends_at < earliest then earliest = ends_at end
    end
    if earliest == nil then return -1 end
    return math.max(1, earliest - st.now)
end

local function publish(command, channel, message)
    if command == 'SPUBLISH' then
        redis.call('SPUBLISH', channel, message)
    else
        redis.call('PUBLISH', channel, message)
    end
end

