#!lua flags=allow-cross-slot-keys
--[[
giveback.lua: gives units back to the counters of one charge (a refund, or the settlement,
release or expiry of a hold) atomically with its bookkeeping. The Rust twin is memory.rs.

KEYS: the n counters, then the control key (refund: the running refunded total of the
consumption; hold: the hold's record), then, when flagged, the index of open holds, the
ledger stream and the idempotency record, in that order, and last the epoch of every
shard the call touches, when given (the service always gives them). On a Redis Cluster all
share one hash tag.

ARGV[1]  now_ms            ARGV[2]  op: 'r' refund, 'c' commit, 'l' release, 'x' expire;
                            'v' void a charge (the control key is its once-marker), 'w'
                            void a hold (like a release): a consume or hold answered 503
                            that Redis decided all the same (engine::recovery::void); refused
                            ({ 2, 'replayed' }) when the key ARGV[11] names exists (a
                            retry was answered with its outcome), else its idempotency
                            record (the idempotency key, when given) is deleted;
                            on a Redis Cluster, for consumes across slots (engine::crossslot):
                            'a' abandon an intent (the control key) at home, 'u' undo a
                            reservation in a foreign slot, 'd' drop a resolved attempt from
                            the index of intents (ARGV[8] the member), 'f' give a refund's or
                            settlement's share back to a foreign slot once (the control key
                            is the marker; ARGV[4] 1 when count policies get theirs back,
                            ARGV[5] what amount policies get; the marker keeps the usage
                            report, which a second call replies as the first did)
ARGV[3]  n                 ARGV[4]  total (the charge or the held amount)
ARGV[5]  amount (refund) or settle (commit)
ARGV[6]  refunded before, per the ledger (used when the running total has expired)
ARGV[7]  the hold's expires_at (ms)   ARGV[8]  the hold id
ARGV[9]  ledger entry to append on success
ARGV[10] idempotency ttl (ms)         ARGV[11] idempotency record ('' when none)
ARGV[12] '1' when the index key is given    ARGV[13] '1' when the stream key is given
ARGV[14] '1' when the idempotency key is given
ARGV[15] '1' when the call reports each counter's usage before and after it (a policy
         alerts, engine::alerts): `before,after` per counter, joined by ';' (`0,0` for a
         counter it does not change), is the reply's third value, and is appended to the
         ledger entry (which ends with the start of a kept answer)
then six values per counter i, at ARGV[16 + 6 * (i - 1)] (and after them, at ARGV[p] with
p = 16 + 6 * n, '1' when a pending share of other slots is kept at home, KEYS[next] and
KEYS[next + 1] its record and the index of intents; then its member, deadline and record):
  (amount policies get min(what the operation gives, charged), which is below zero for a
  commit above the hold, an over-capture: the counter is charged that much more)
  kind 1 calendar or lifetime (an integer; its time to live, if any, is kept) | 2 rolling |
       3 token bucket | 4 zoned calendar
  p1   rolling: the bucket charged; token bucket: period_ms; zoned: when it was charged
  p2   rolling: bucket_ms; token bucket: the limit (drain rate)
  p3   rolling: buckets (W / B)
  by_amount  1: gets the amount back; 0 (count policy): gets its charge back only when
             the whole charge is given back
  charged    what the charge put on this counter
and last, ARGV[#ARGV]: the floors of the given epochs' write generations, as consume.lua
takes them (a shard older than the ledger is refused, 5, and its epoch deleted); every
call past the epochs' check increments their generations.

Returns { status, value }: 1 done (value: refunded total after a refund, else 0; and the
usage report when asked),
2 conflict (value: refunded total, or the hold's state as a string), 3 replay (value: the
kept record), 4 unknown hold, 5 the shard has no epoch (nothing done: its state is not the
ledger's until a rebuild sets it).

A counter gets back at most what it holds now: a calendar period that has ended (its key
gone), a rolling bucket that no longer counts, or a drained token bucket changes nothing,
and the give-back is still recorded.
]]

local MAX = 9007199254740991
local floor, ceil, fmt = math.floor, math.ceil, string.format
local now = tonumber(ARGV[1])
local op = ARGV[2]
local n = tonumber(ARGV[3])
local total = tonumber(ARGV[4])
local amount = tonumber(ARGV[5])
local control = KEYS[n + 1]
local k = n + 2
local index_key, stream_key, idem_key
if ARGV[12] == '1' then index_key = KEYS[k]; k = k + 1 end
if ARGV[13] == '1' then stream_key = KEYS[k]; k = k + 1 end
if ARGV[14] == '1' then idem_key = KEYS[k]; k = k + 1 end

-- After the counters' values: the pending share of other slots (Redis Cluster).
local p = 16 + 6 * n
local pending_key, pendings_key
if ARGV[p] == '1' then pending_key = KEYS[k]; pendings_key = KEYS[k + 1] end

local flagged = (ARGV[12] == '1' and 1 or 0) + (ARGV[13] == '1' and 1 or 0) + (ARGV[14] == '1' and 1 or 0)
  + (ARGV[p] == '1' and 2 or 0)
local floors = {}
for floor in string.gmatch(ARGV[#ARGV], '%d+') do floors[#floors + 1] = tonumber(floor) end
for i = n + 2 + flagged, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then return { 5, 0 } end
  local floor = floors[i - n - 1 - flagged]
  if floor and floor > 0 then
    local generation = redis.call('GET', string.sub(KEYS[i], 1, -6) .. 'gen')
    if generation and tonumber(generation) < floor then
      redis.call('DEL', KEYS[i])
      return { 5, 0 }
    end
  end
end
for i = n + 2 + flagged, #KEYS do redis.call('INCR', string.sub(KEYS[i], 1, -6) .. 'gen') end

local voids = op == 'v' or op == 'w'
if idem_key and not voids then
  local kept = redis.call('GET', idem_key)
  if kept then return { 3, kept } end
end
if voids and idem_key and redis.call('EXISTS', ARGV[11]) == 1 then return { 2, 'replayed' } end

-- The current epoch of the (one) shard, to tell records made before a rebuild.
local epoch_now = ''
if #KEYS >= n + 2 + flagged then epoch_now = redis.call('GET', KEYS[#KEYS]) or '' end

-- What each counter gets back: decided by the operation.
local full, by_amount_gets
local result = 0
if op == 'a' then
  -- Abandon a consume's intent at home: its home charges go back once, unless it committed
  -- (or was made before a rebuild, which the rebuilt counters do not hold).
  local record = redis.call('GET', control)
  if not record then return { 4, 0 } end
  local state, epoch = string.match(record, '^(%a+)\n([^\n]*)\n')
  if state == 'committed' then return { 2, 'committed' } end
  if state ~= 'open' then return { 1, 0 } end
  redis.call('SET', control, 'abandoned' .. string.sub(record, #state + 1), 'KEEPTTL')
  if epoch ~= epoch_now then n = 0 end
  full, by_amount_gets = true, MAX
elseif op == 'u' then
  -- Undo a reservation in a foreign slot, once; a missing one leaves a tombstone, so that
  -- a reservation arriving late is refused.
  local record = redis.call('GET', control)
  if record and string.sub(record, 1, 6) == 'undone' then return { 1, 0 } end
  redis.call('SET', control, 'undone', 'PX', 60000)
  if not record or string.match(record, '^open\n([^\n]*)') ~= epoch_now then return { 1, 0 } end
  full, by_amount_gets = true, MAX
elseif op == 'd' then
  -- The attempt is resolved: out of the index of intents.
  if index_key then redis.call('ZREM', index_key, ARGV[8]) end
  return { 1, 0 }
elseif op == 'f' then
  -- A give-back's share in a foreign slot, once per entry (the control key is the marker,
  -- which keeps the usage report: a second call replies it again).
  local marker = redis.call('GET', control)
  if marker and ARGV[15] == '1' then return { 1, 0, string.sub(marker, 3) } end
  if marker then return { 1, 0 } end
  redis.call('SET', control, '1', 'PX', 600000)
  full, by_amount_gets = total == 1, amount
elseif op == 'v' then
  if not redis.call('SET', control, '1', 'NX', 'PX', 86400000) then return { 2, 'voided' } end
  full, by_amount_gets = true, total
elseif op == 'r' then
  local before = tonumber(redis.call('GET', control) or ARGV[6])
  if before + amount > total then return { 2, before } end
  result = before + amount
  full = result == total
  by_amount_gets = amount
else
  local record = redis.call('GET', control)
  if not record then
    if index_key then redis.call('ZREM', index_key, ARGV[8]) end
    return { 4, 0 }
  end
  local state = string.sub(record, 1, (string.find(record, '\n', 1, true) or 0) - 1)
  if state ~= 'open' then return { 2, state } end
  local expires_at = tonumber(ARGV[7])
  if op ~= 'x' and now >= expires_at then return { 2, 'expired' } end
  if op == 'x' and now < expires_at then return { 2, 'open' } end
  local new_state = ({ c = 'committed', l = 'released', x = 'expired', w = 'voided' })[op]
  redis.call('SET', control, new_state .. string.sub(record, #state + 1), 'KEEPTTL')
  if index_key then redis.call('ZREM', index_key, ARGV[8]) end
  if op == 'c' then
    full = false
    by_amount_gets = total - amount
  else
    full = true
    by_amount_gets = total
  end
end

-- A step across slots counts in the shard's version (keys::cross_slot_version).
if op == 'a' or op == 'u' or op == 'f' then
  redis.call('INCR', string.match(control, '^(.*)#') .. '#xv')
end

local reports = ARGV[15] == '1'
local usage = {}
for i = 1, n do
  local a = 16 + 6 * (i - 1)
  local key, kind = KEYS[i], ARGV[a]
  local charged = tonumber(ARGV[a + 5])
  local give
  if ARGV[a + 4] == '1' then give = math.min(by_amount_gets, charged)
  elseif full then give = charged
  else give = 0 end
  -- The counter's usage before and after, when reported.
  local before, after = 0, 0
  -- A give below zero charges more (an over-capture's excess), up to 2^53 - 1.
  if give ~= 0 then
    if kind == '1' then
      local v = tonumber(redis.call('GET', key) or -1)
      if v >= 0 then
        local left = v - give
        if left < 0 then left = 0 end
        if left > MAX then left = MAX end
        redis.call('SET', key, fmt('%d', left), 'KEEPTTL')
        before, after = v, left
      end
    elseif kind == '4' then
      -- Only the period the units were charged in gets them back.
      local raw = redis.call('GET', key)
      if raw then
        local u0, s0, e0 = string.match(raw, '^(%d+):(-?%d+):(-?%d+)$')
        local at = tonumber(ARGV[a + 1])
        if u0 and tonumber(s0) <= at and at < tonumber(e0) then
          local left = tonumber(u0) - give
          if left < 0 then left = 0 end
          if left > MAX then left = MAX end
          redis.call('SET', key, fmt('%d:%s:%s', left, s0, e0), 'KEEPTTL')
          before, after = tonumber(u0), left
        end
      end
    elseif kind == '2' then
      local idx, bms, nb = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
      if idx >= floor(now / bms) - nb then
        local field = fmt('%d', idx)
        local v = tonumber(redis.call('HGET', key, field) or -1)
        if v >= 0 then
          local left = v - give
          if left < 0 then left = 0 end
          if left > MAX then left = MAX end
          redis.call('HSET', key, field, fmt('%d', left))
          if reports then
            -- The window's usage: every bucket that still counts, as consume.lua sums it.
            local h, lo = redis.call('HGETALL', key), floor(now / bms) - nb
            for j = 1, #h, 2 do
              if tonumber(h[j]) >= lo then after = after + tonumber(h[j + 1]) end
            end
            before = after - left + v
          end
        end
      end
    else
      local per, limit = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
      local rate = limit
      if rate < 1 then rate = 1 end
      local raw = redis.call('GET', key)
      if raw then
        local sep = string.find(raw, ':', 1, true)
        local s = tonumber(string.sub(raw, 1, sep - 1))
        local t = tonumber(string.sub(raw, sep + 1))
        local tref = now
        if t > now then tref = t
        elseif (now - t) * rate >= s then s = 0
        else s = s - (now - t) * rate end
        before = ceil(s / per)
        -- give * per may not fit 2^53: compare through a division first.
        if give >= ceil(s / per) then s = 0 else s = s - give * per end
        if s > MAX then s = MAX end
        redis.call('SET', key, fmt('%d:%d', s, tref), 'KEEPTTL')
        after = ceil(s / per)
      end
    end
  end
  if reports then usage[i] = fmt('%d,%d', before, after) end
end
local report = ''
if reports then report = table.concat(usage, ';') end

if op == 'f' and reports then redis.call('SET', control, '1\n' .. report, 'KEEPTTL') end
if op == 'r' then
  -- Kept long enough for any refund the ledger could still authorise concurrently.
  redis.call('SET', control, fmt('%d', result), 'PX', 2592000000)
end
if stream_key then redis.call('XADD', stream_key, '*', 'e', ARGV[9] .. report) end
if pending_key then
  -- The share of other slots, given back next; the sweeper redoes it after a crash.
  redis.call('SET', pending_key, fmt('pending %d %d\n', full and 1 or 0, by_amount_gets)
    .. epoch_now .. '\n' .. ARGV[p + 2] .. '\n' .. ARGV[p + 3], 'PX', 600000)
  redis.call('ZADD', pendings_key, ARGV[p + 2], ARGV[p + 1])
end
if voids and idem_key then
  redis.call('DEL', idem_key)
elseif idem_key and ARGV[11] ~= '' then
  redis.call('SET', idem_key, ARGV[11] .. '\n' .. fmt('%d', result), 'PX', ARGV[10])
end
if reports then return { 1, result, report } end
return { 1, result }
