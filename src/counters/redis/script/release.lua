#!lua flags=allow-cross-slot-keys
--[[
release.lua: gives a lease up, if its holder asks (engine::janitor, at a graceful stop).

KEYS[1]  the lease
ARGV[1]  the owner (an instance's id)

Returns 1 when the lease was deleted, 0 when another holds it (or nobody does).
]]

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
