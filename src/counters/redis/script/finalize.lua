#!lua flags=allow-cross-slot-keys
--[[
finalize.lua: the commit point of a consume across Redis Cluster slots (engine::crossslot),
at home: the intent opened with the home charges becomes `committed`, and the consume's
effects are applied, all or nothing.

KEYS[1]  the intent               KEYS[2]  the index of intents
then, when present, the idempotency record, the ledger stream, the hold record and the
index of holds, in that order; last the shard's epoch, when given. An effect is present
when its value is not empty: ARGV[5] the idempotency record, ARGV[6] the ledger entry,
ARGV[8] the hold id (script/finalize.rs writes them).
ARGV[1]  now_ms                   ARGV[2]  the attempt (the index's member)
ARGV[3]  '1' when the ledger entry keeps the answer without an idempotency record (the
         reply numbers are appended to it then too); '' otherwise
ARGV[4]  idem ttl                 ARGV[5]  idem record (the reply numbers are appended)
ARGV[6]  the ledger entry; with an idempotency record the reply numbers are appended to it
ARGV[7]  the reply numbers, as consume.lua formats them
ARGV[8]  hold id    ARGV[9] its expiry (the index score)    ARGV[10] hold record
ARGV[11] hold ttl
ARGV[#ARGV] the floor of the shard's write generation, as consume.lua takes it (a shard
         older than the ledger is refused, { -2 }, and its epoch deleted); a call past the
         epoch's check increments the generation

Returns { 1 } committed, { 0 } aborted (the intent is not open: abandoned, gone, or its
deadline has passed; nothing done), { -1, kept } the idempotency key was used by a retry
that committed first (nothing done), { -2 } the shard has no epoch.
]]

local now = tonumber(ARGV[1])
local has_idem = ARGV[5] ~= ''
local has_ledger = ARGV[6] ~= ''
local has_hold = ARGV[8] ~= ''
local keeps_answer = ARGV[3] == '1'
local k = 3
local idem_key, stream_key, hold_key, holds_key
if has_idem then idem_key = KEYS[k]; k = k + 1 end
if has_ledger then stream_key = KEYS[k]; k = k + 1 end
if has_hold then hold_key = KEYS[k]; holds_key = KEYS[k + 1]; k = k + 2 end
local floor = tonumber(string.match(ARGV[#ARGV], '^%d+'))
for i = k, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then return { -2 } end
  if floor and floor > 0 then
    local generation = redis.call('GET', string.sub(KEYS[i], 1, -6) .. 'gen')
    if generation and tonumber(generation) < floor then
      redis.call('DEL', KEYS[i])
      return { -2 }
    end
  end
  redis.call('INCR', string.sub(KEYS[i], 1, -6) .. 'gen')
end

if has_idem then
  local kept = redis.call('GET', idem_key)
  if kept then return { -1, kept } end
end

local record = redis.call('GET', KEYS[1])
if not record then return { 0 } end
local state, epoch, deadline = string.match(record, '^(%a+)\n([^\n]*)\n(-?%d+)\n')
if state ~= 'open' or now > tonumber(deadline) then return { 0 } end
redis.call('SET', KEYS[1], 'committed' .. string.sub(record, #state + 1), 'KEEPTTL')
redis.call('ZREM', KEYS[2], ARGV[2])

local numbers = ''
if has_idem or keeps_answer then numbers = ARGV[7] end
if has_idem then
  redis.call('SET', idem_key, ARGV[5] .. '\n' .. numbers, 'PX', ARGV[4])
end
if has_ledger then redis.call('XADD', stream_key, '*', 'e', ARGV[6] .. numbers) end
if has_hold then
  redis.call('SET', hold_key, 'open\n' .. ARGV[10], 'PX', ARGV[11])
  redis.call('ZADD', holds_key, ARGV[9], ARGV[8])
end
return { 1 }
