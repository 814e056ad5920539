--[[
ack.lua: acknowledges ledger entries that are safely in SQL and deletes them from their
stream, in one atomic step (engine::drain). Done in two calls, a crash or a failed call
between them left an entry acknowledged but still in the stream: delivered to no one
again, and counted in the backlog for good.

KEYS[1]  the shard's ledger stream
ARGV[1]  the consumer group
ARGV[2…] the entries' ids

Returns how many entries were deleted.
]]

local deleted = 0
-- unpack is bounded by Lua's stack: a thousand ids at a time.
for i = 2, #ARGV, 1000 do
  local last = math.min(i + 999, #ARGV)
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, last))
  deleted = deleted + redis.call('XDEL', KEYS[1], unpack(ARGV, i, last))
end
return deleted
