#!lua flags=allow-cross-slot-keys
--[[
record.lua: reads a record (a hold's, a refunded total) unless its shard has no epoch.

KEYS[1]  the record           KEYS[2]  the shard's epoch (same hash tag), when given
Returns the record's text, nil when there is none, or -2 when the shard has no epoch: its
state is not the ledger's until a rebuild sets it, so a missing record proves nothing.
]]

if #KEYS > 1 and redis.call('EXISTS', KEYS[2]) == 0 then return -2 end
return redis.call('GET', KEYS[1])
