#!lua flags=allow-cross-slot-keys
--[[
lease.lua: takes a lease, or extends it for its holder (the janitor's, engine::janitor).

KEYS[1]  the lease
ARGV[1]  the owner (an instance's id)
ARGV[2]  how long the lease lasts, ms

Returns 1 when ARGV[1] holds the lease now (taken, or extended), 0 while another holds it.
]]

local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
