#!lua flags=allow-cross-slot-keys
--[[
restore.lua: writes part of one shard's state, as rebuilt from the ledger, while the shard is
closed (it has no epoch) and the caller holds the shard's rebuild lock; and opens the shard.
Every value is absolute (what the key must hold), so writing it twice changes nothing.

KEYS[1]      the shard's rebuild lock
KEYS[2]      the shard's epoch
KEYS[2 + i]  the key of item i; every key shares the shard's hash tag
ARGV[1]      the caller's lock token
ARGV[2]      the lock's new time to live, ms (each call extends it)
ARGV[3]      '1': open the shard after writing (set the epoch, delete the lock)
then three values per item i, at ARGV[4 + 3 * (i - 1)]:
  kind   's': a string (a calendar counter, a token bucket "s:t", a record), kept ttl ms
         'h': a rolling counter's hash, fields "index:units,index:units,...", kept ttl ms
         'z': a member (value) of a sorted set (the shard's index of open holds), score ttl
         'd': the key is deleted (before a sorted set is written anew)
         'g': a number the key is raised to, kept for ever (the shard's write generation:
              at least its floor, redis/generations.rs)
  ttl    ms to keep the key ('s', 'h'; 0 for ever: a lifetime counter); the member's score
         ('z'); unused ('d')
  value  the string; the hash's fields; the member; unused ('d')

Returns 1 when written (and opened if asked), 0 when refused: the lock is not, or no longer,
the caller's, or the shard is open already (another instance rebuilt it).
]]

local lock, epoch = KEYS[1], KEYS[2]
if redis.call('GET', lock) ~= ARGV[1] or redis.call('EXISTS', epoch) == 1 then return 0 end
redis.call('PEXPIRE', lock, ARGV[2])

local n = (#ARGV - 3) / 3
for i = 1, n do
  local a = 4 + 3 * (i - 1)
  local key, kind, ttl, value = KEYS[2 + i], ARGV[a], ARGV[a + 1], ARGV[a + 2]
  if kind == 's' and ttl == '0' then
    redis.call('SET', key, value)
  elseif kind == 's' then
    redis.call('SET', key, value, 'PX', ttl)
  elseif kind == 'h' then
    redis.call('DEL', key)
    local fields = {}
    for index, units in string.gmatch(value, '(-?%d+):(%d+)') do
      fields[#fields + 1] = index
      fields[#fields + 1] = units
    end
    if #fields > 0 then
      redis.call('HSET', key, unpack(fields))
      redis.call('PEXPIRE', key, ttl)
    end
  elseif kind == 'g' then
    if tonumber(redis.call('GET', key) or '0') < tonumber(value) then redis.call('SET', key, value) end
  elseif kind == 'z' then
    redis.call('ZADD', key, ttl, value)
  else
    redis.call('DEL', key)
  end
end

if ARGV[3] == '1' then
  redis.call('SET', epoch, ARGV[1])
  redis.call('DEL', lock)
end
return 1
