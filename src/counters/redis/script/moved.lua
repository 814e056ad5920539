--[[
moved.lua: ends a move of a shard's consumes recorded in the ledger's totals once its
rows are in SQL (move.lua): deletes the moving hash, if it is still the content moved.

KEYS[1]  the shard's moving hash (keys.rs totals_moving)
KEYS[2]  the shard's deletes-held key (a verify's token, engine::cut)
ARGV[1]  the content's id (the hash's field '#') as moved

While a verify holds deletions, the hash is kept: the verify then finds each of its
consumes in SQL or in Redis, and the next move hands it out again (its rows are in SQL
already: inserting them again adds nothing). Returns 1 when deleted, 0 otherwise.
]]

if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('HGET', KEYS[1], '#') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
