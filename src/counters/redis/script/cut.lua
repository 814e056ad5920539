#!lua flags=allow-cross-slot-keys
--[[
cut.lua: reads, at one instant, what a `counters verify` compares (engine::cut): the
entries still in some shards' ledger streams and the states of some counters, while the
verify holds deletions from those streams (so that no entry left them unseen).

KEYS[1..n]      the shards' ledger streams
KEYS[n+1..2n]   their deletes-held keys
KEYS[2n+1..3n]  their indexes of intents (consumes across Redis Cluster slots)
KEYS[3n+1..4n]  their hashes of consumes recorded in the totals, waiting (keys.rs
                totals_waiting)
KEYS[4n+1..5n]  the same being moved (totals_moving)
KEYS[5n+1…]     counters
ARGV[1]         the verify's token
ARGV[2]         n

Returns 0 if a stream's deletions are no longer held by the token (the hold expired, and
entries may have left). Otherwise the XRANGE reply of each stream, in order; then, per
shard, the records of the intents in its index (an open one has charged its home counters
and has no entry yet); then per shard the HGETALL reply of its waiting hash, then of its
moving one; then one {kind, value, pttl} per counter: kind 's' (a string, as
kept), 'h' (a hash: value is the HGETALL reply) or 'n' (no such key).
]]

local n = tonumber(ARGV[2])
for i = 1, n do
  if redis.call('GET', KEYS[n + i]) ~= ARGV[1] then return 0 end
end
local reply = {}
for i = 1, n do
  reply[i] = redis.call('XRANGE', KEYS[i], '-', '+')
end
for i = 1, n do
  -- An intent's key is its index's ('…#xs') without the 's', then the attempt.
  local base = string.sub(KEYS[2 * n + i], 1, -2)
  local records = {}
  for _, attempt in ipairs(redis.call('ZRANGE', KEYS[2 * n + i], 0, -1)) do
    local record = redis.call('GET', base .. attempt)
    if record then records[#records + 1] = record end
  end
  reply[n + i] = records
end
for i = 3 * n + 1, 5 * n do
  reply[#reply + 1] = redis.call('HGETALL', KEYS[i])
end
for i = 5 * n + 1, #KEYS do
  local key = KEYS[i]
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'string' then
    reply[#reply + 1] = { 's', redis.call('GET', key), redis.call('PTTL', key) }
  elseif kind == 'hash' then
    reply[#reply + 1] = { 'h', redis.call('HGETALL', key), redis.call('PTTL', key) }
  else
    reply[#reply + 1] = { 'n', '', -2 }
  end
end
return reply
