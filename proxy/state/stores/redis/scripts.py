"""The Lua scripts the Redis store runs, each one step the server takes whole."""

from __future__ import annotations

from typing import Final

# Delete the lock only if we still own it: after an expiry another holder may.
RELEASE: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

# Extend the lock only while we still own it (a lease kept alive by its holder).
RENEW: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Close one open compaction unless its latest event changed since it was read,
# so two replicas starting together record one failure, not two.
CLOSE_OPEN: Final = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
    return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
redis.call('LPUSH', KEYS[3], ARGV[3])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[5]) - 1)
redis.call('PEXPIRE', KEYS[3], ARGV[6])
redis.call('LPUSH', KEYS[4], ARGV[3])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[4]) - 1)
redis.call('PEXPIRE', KEYS[4], ARGV[6])
return 1
"""

# Hold each session key KEYS[i] at least ARGV[i] ms (-1: for ever): set when
# missing, lengthened when shorter, never shortened, so a backfill that read a
# checkpoint's expiry cannot cut short the key a put just set for a newer one.
# Answers how many keys it set.
HOLD: Final = """
local set = 0
for i, key in ipairs(KEYS) do
    local want = tonumber(ARGV[i])
    local left = redis.call('PTTL', key)
    if want == -1 then
        if left ~= -1 then
            redis.call('SET', key, '1')
            set = set + 1
        end
    elseif left ~= -1 and left < want then
        redis.call('SET', key, '1', 'PX', want)
        set = set + 1
    end
end
return set
"""
