#!lua flags=allow-cross-slot-keys
--[[
ack.lua: acknowledges ledger entries that are safely in SQL and deletes them from their
stream, in one atomic step (engine::drain). Done in two calls, a crash or a failed call
between them left an entry acknowledged but still in the stream: delivered to no one
again, and counted in the backlog for good.

While a `counters verify` reads the shard (KEYS[2] exists, engine::cut), the entries are
acknowledged but kept in the stream, their ids listed in KEYS[3]: the verify then finds
every entry either in SQL or in the stream. The first acknowledgement after it let go (or
died, and KEYS[2] expired) deletes them.

KEYS[1]  the shard's ledger stream
KEYS[2]  the shard's deletes-held key (a verify's token)
KEYS[3]  the shard's list of entries acknowledged while deletes were held
ARGV[1]  the consumer group
ARGV[2…] the entries' ids

Returns how many entries were deleted.
]]

local held = redis.call('EXISTS', KEYS[2]) == 1
local deleted = 0
-- unpack is bounded by Lua's stack: a thousand ids at a time.
for i = 2, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, last))
  if held then
    redis.call('RPUSH', KEYS[3], unpack(ARGV, i, last))
  else
    deleted = deleted + redis.call('XDEL', KEYS[1], unpack(ARGV, i, last))
  end
end
if not held and redis.call('EXISTS', KEYS[3]) == 1 then
  local ids = redis.call('LRANGE', KEYS[3], 0, -1)
  for i = 1, #ids, 1000 do
    deleted = deleted + redis.call('XDEL', KEYS[1], unpack(ids, i, math.min(i + 999, #ids)))
  end
  redis.call('DEL', KEYS[3])
end
return deleted
