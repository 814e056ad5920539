--[[
move.lua: hands the drain a shard's consumes recorded in the ledger's totals, to move
into SQL as folded rows (engine::pipeline::drain, engine::pipeline::fold).

KEYS[1]  the shard's hash of waiting consumes (keys.rs totals_waiting)
KEYS[2]  the same being moved (totals_moving)
KEYS[3]  the shard's write generation
ARGV     none

A move not finished (KEYS[2] is still there: its insert or its delete failed, or a verify
held deletions) is handed out again, whole, as it was; otherwise the waiting hash becomes
the moving one (RENAME), and consumes decided from now on wait in a new one. Either way
the shard's generation is incremented: the drain records it as the shard's floor once
the rows are in SQL, so that a Redis restored from a snapshot taken before this move
(which would hand the same consumes out again, and keep adding to them) is caught
(redis/generations.rs). Returns {} when nothing waits; else { generation, HGETALL reply,
resumed }, resumed 1 when the move handed out is one not ended before, else 0.
]]

local resumed = 1
if redis.call('EXISTS', KEYS[2]) == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
  redis.call('RENAME', KEYS[1], KEYS[2])
  resumed = 0
end
local generation = redis.call('INCR', KEYS[3])
return { generation, redis.call('HGETALL', KEYS[2]), resumed }
