#!lua flags=allow-cross-slot-keys
--[[
consume.lua: checks every charge of one quota decision and applies all of them or none.
The Rust twin of this script is memory.rs; conformance.rs runs the same scenarios on both.

KEYS[i]   the counter of charge i; on a Redis Cluster all keys of one call share a hash tag
          (one slot; a standalone Redis takes budgets of several shards in one call);
          after the effects' keys (below), the epoch of every shard the call touches, when
          given (the service always gives them; the counting conformance suite, whose keys
          are in no shard, not)
ARGV[1]   now_ms (integer, Unix milliseconds or a test clock)
ARGV[2]   1 = apply the charges when the decision is allowed, 0 = only look (peek)
then six values per charge i, starting at ARGV[3 + 6 * (i - 1)]:
  kind     1 = calendar, 2 = rolling, 3 = token bucket, 4 = zoned calendar, 5 = per-request
           maximum (its key is neither read nor written: used = cost, nothing accumulates),
           6 = lifetime (an integer kept with no time to live; it never resets)
  p1       calendar, zoned calendar: period_end_ms; rolling: bucket_ms; token bucket: period_ms
  p2       rolling: buckets (W / B); 0 otherwise
  limit    0 ..= 2^53 - 1
  cost     0 ..= 2^53 - 1
  enforce  1 = enforce, 0 = shadow (counted and reported, never denies)

then fifteen values for the consume's effects, always present (empty strings when
unused), at ARGV[e .. e + 14] with e = 3 + 6 * n, read into the locals of their names
(script/consume.rs writes them in this order). An effect is present when its value is
not empty: the idempotency record (`idem record`), the ledger (`allowed` or `denied`), the
hold (`hold id`), the totals (`totals id`), the intent (`intent`) and the reservation
(`attempt` without an `intent`); its keys, in this order, follow the charges' keys.
  keeps        '1' when the allowed entry keeps the answer without an idempotency record
               (a policy alerts): the reply numbers are appended to it; '' otherwise
  idem ttl     ms to keep the idempotency record       (KEYS[n + 1] when present)
  idem record  what to keep with the reply numbers
  allowed      ledger entry appended when the decision is applied (KEYS[next]: the stream);
               with an idempotency record, the reply numbers (as kept with the record) are
               appended to it: it ends with the compact kept answer, then '\n'
  denied       ledger entry appended when a consume is denied ('' for none)
  hold id      the hold's id, the member of the index  (KEYS[next]: the hold record,
  expires_at   its expiry, the index score              KEYS[next + 1]: the index of holds)
  hold record  what to keep for settling it
  hold ttl     ms to keep the hold record
  attempt      Redis Cluster, a consume across slots (engine::crossslot): its id, the
               member of the index of intents (with a reservation: the caller's clock now)
  deadline     after it (ms), the attempt can no longer commit, nor reserve
  intent       the intent's record           (KEYS[next]: the intent, KEYS[next + 1]: the
               index of intents, with an intent; KEYS[next]: the reservation, with a
               reservation)
  call deadline  when the caller stops waiting for this call, on its wall clock (Unix ms;
               '' for none): a call that Redis runs later than that plus CLOCK_SKEW (by
               Redis's own clock, TIME) does nothing and replies { -4 }, so that a caller
               that gave up knows, once that time has passed on its clock plus the skew,
               whether the call was applied (engine::recovery::void)
  on crossing  with the answer kept for alerts only ('' otherwise): `<i>:<level>,…;<kept>`,
               the allowed entry (given plain) keeps its answer, <kept> then the numbers
               appended to it, only when usage of charge i goes from below level (usage
               after less cost) to at or above it for some listed pair (there may be none:
               a limit of 0 has no level above 0); otherwise the entry is appended as given
  totals id    a consume recorded in the ledger's totals (KEYS[next]: its shard's hash of
               consumes waiting to be moved, keys.rs totals_waiting): the allowed entry's
               id. The entry (allowed or denied) is then kept in that hash instead of the
               stream, under this id (with '!' after it for the denied entry), and the
               hash's field '#' is set to the id unless it is set (it names the content for
               the drain's move); an allowed entry that keeps its answer (a threshold
               crossed) goes to the stream all the same
and last, the floors of the write generations of the shards whose epochs are given, in
their order, comma-separated ('' without epochs): a shard whose generation (its epoch's key
with `#gen` for `#epoch`) is below its floor is older than the ledger (redis/generations.rs);
so n = (#ARGV - 18) / 6.

With an intent (at home), the charges are applied with the intent `open\n<epoch>\n<deadline>\n
<record>`, and the idempotency record is only checked: it, the allowed ledger entry and the
hold wait for finalize.lua. With a reservation (in a foreign slot), a reservation that
exists already (undone) or a deadline passed is refused ({ -3 }); an allowed one is kept as
`open\n<epoch>` for 60 s. Both count in the shard's version of steps across slots (the key
up to its last `#`, then `#xv`), which a verify reads.

When the call runs past its call deadline, nothing is read or decided and the reply is { -4 }.
When a shard's epoch is missing (Redis lost its data, or the shard was never rebuilt
from the ledger), nothing is read or decided and the reply is { -2 }; so too when a shard's
generation is below its floor (Redis came back older than the ledger), whose epoch is then
deleted, so that the shard is rebuilt. A call that may change its shards (not a peek)
increments each one's generation.
When the idempotency record exists already, nothing is decided and the reply is
  { -1, record .. "\n" .. the original reply numbers, comma-separated }; a committing call
  also marks the record's outcome as given (the record's key with '}#o' for '}#i', kept as
  long as the record), so that the attempt it records is never voided (engine::recovery::void),
  unless it asks for another amount (the engine answers that 409).
Otherwise it returns a flat array of integers:
  { allowed_all, used_1, allowed_1, resets_at_1, retry_at_1, used_2, ... }
allowed_all and allowed_i are 1 or 0; retry_at_i is -1 when the charge passes or can never
pass (cost > limit): the caller knows cost and limit, so it does not rely on the -1 alone.

State per key:
  calendar      string: units used in the period the key names
  rolling       hash: bucket index (floor(ms / bucket_ms), decimal) -> units
  token bucket  string "S:t": S = used * period_ms as of time t (drains by max(limit, 1) per ms)
  zoned cal.    string "used:start:end": the running period (now < end) counts, whatever
                period_end_ms the request offers; else a new one runs from now to
                period_end_ms (the end of the period in the request's own time zone)

Numbers: Lua numbers are doubles, exact for integers below 2^53. The caller (Rust) validates
that limits and costs are <= 2^53 - 1, times are within +-2^51 and that
limit * period_ms <= 2^53 - 1, so every stored or returned value stays exact; products that
may be larger (elapsed * rate) are only compared, never stored. Reported times that would
pass 2^53 - 1 (a saturated shadow bucket) are clamped to it. Numbers handed to Redis are
formatted with %d: Redis would otherwise print large ones as 1.2e+17.

Cost: one read per key (GET or HGETALL), then, only if the decision applies, one INCRBY per
calendar key that exists (SET with its TTL for a new one), one SET per token-bucket or zoned
key, and HDEL (stale buckets only) + HINCRBY + PEXPIRE per rolling key.
]]

local MAX = 9007199254740991 -- 2^53 - 1
local GRACE = 60000 -- KEY_GRACE_MS in mod.rs
local CLOCK_SKEW = 1000 -- CLOCK_SKEW_MS in engine/recovery/void.rs: how far apart clocks may be
local floor, ceil, fmt = math.floor, math.ceil, string.format

local now = tonumber(ARGV[1])
local commit = ARGV[2] == '1'
local n = (#ARGV - 18) / 6
local e = 3 + 6 * n

local keeps, idem_ttl, idem_record, allowed_entry, denied_entry, hold_id, hold_expiry,
  hold_record, hold_ttl, attempt, deadline, intent_record, call_deadline, on_crossing,
  totals_id = unpack(ARGV, e, e + 14)

if call_deadline ~= '' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000) > tonumber(call_deadline) + CLOCK_SKEW then
    return { -4 }
  end
end
local has_idem = idem_record ~= ''
local has_ledger = allowed_entry ~= '' or denied_entry ~= ''
local has_hold = hold_id ~= ''
local has_totals = totals_id ~= ''
local has_intent = intent_record ~= ''
local has_reservation = attempt ~= '' and not has_intent
local keeps_answer = keeps == '1'
local k = n + 1 -- next extra key
local idem_key, stream_key, hold_key, index_key, totals_key, intent_key, intents_key,
  reservation_key
if has_idem then idem_key = KEYS[k]; k = k + 1 end
if has_ledger then stream_key = KEYS[k]; k = k + 1 end
if has_hold then hold_key = KEYS[k]; index_key = KEYS[k + 1]; k = k + 2 end
if has_totals then totals_key = KEYS[k]; k = k + 1 end
if has_intent then intent_key = KEYS[k]; intents_key = KEYS[k + 1]; k = k + 2 end
if has_reservation then reservation_key = KEYS[k]; k = k + 1 end

local effect_keys = k - n - 1
local first_epoch = n + effect_keys + 1
local epoch_now = ''
local floors = {}
for floor in string.gmatch(ARGV[#ARGV], '%d+') do floors[#floors + 1] = tonumber(floor) end
for i = first_epoch, #KEYS do
  local epoch = redis.call('GET', KEYS[i])
  if not epoch then return { -2 } end
  if i == first_epoch then epoch_now = epoch end
  local floor = floors[i - first_epoch + 1]
  if floor and floor > 0 then
    local generation = redis.call('GET', string.sub(KEYS[i], 1, -6) .. 'gen')
    if generation and tonumber(generation) < floor then
      redis.call('DEL', KEYS[i])
      return { -2 }
    end
  end
end
if commit then
  for i = first_epoch, #KEYS do redis.call('INCR', string.sub(KEYS[i], 1, -6) .. 'gen') end
end

if has_reservation then
  if redis.call('EXISTS', reservation_key) == 1 or tonumber(attempt) > tonumber(deadline) then
    return { -3 }
  end
end

if has_idem then
  local kept = redis.call('GET', idem_key)
  if kept then
    -- The outcome is now the caller's: an attempt answered 503 that Redis decided all the
    -- same is never voided once a retry was answered with it (keys.rs: outcome_given).
    -- A retry that asks for another amount is answered 409, not with the outcome.
    local asked = string.match(idem_record, '"amount":(%d+)')
    if commit and asked == string.match(kept, '"amount":(%d+)') then
      local given = string.gsub(idem_key, '}#i', '}#o', 1)
      redis.call('SET', given, '1', 'PX', math.max(redis.call('PTTL', idem_key), 1))
    end
    return { -1, kept }
  end
end

-- A table made at its final size of `size` slots, holding ARGV's values until they are
-- overwritten (every slot is written before it is read): grown one slot at a time, Lua 5.1
-- rehashes a table at every power of two. unpack is bounded by Lua's stack (8000 slots):
-- a larger table (hundreds of charges decided together) grows.
local function presized(size)
  if size > 4000 then return {} end
  return { unpack(ARGV, 1, size) }
end

local out = presized(4 * n + 1)
out[1] = 1
-- Per charge, what pass 2 writes (only filled when committing; value nil: nothing), stride 6:
-- value, ttl, used after, resets_at after, then
--   rolling: HGETALL reply (for stale fields), lo
--   calendar: whether INCRBY can write it: the key exists, so it expires at the period's end
--   (plus the grace) as this write would set it, and the sum fits
local w = presized(6 * n)

-- Time sums that may exceed 2^53 - 1 only with a saturated shadow bucket: clamp them.
-- Rounding is monotone, so a true sum above MAX never comes out <= MAX.
local function clamp(x)
  if x > MAX then return MAX end
  return x
end

-- Pass 1: read every key, decide each charge, remember what to write.
for i = 1, n do
  local a = 3 + 6 * (i - 1)
  local key = KEYS[i]
  local kind = ARGV[a]
  local p1 = tonumber(ARGV[a + 1])
  local limit = tonumber(ARGV[a + 3])
  local cost = tonumber(ARGV[a + 4])
  local ok = cost <= limit -- pass_i, refined per kind below
  w[6 * i - 5] = nil
  local used, resets, retry = 0, now, -1

  if kind == '1' then
    local raw = redis.call('GET', key)
    local v = tonumber(raw or 0)
    used = v
    ok = ok and v <= limit - cost
    if v > 0 then resets = p1 end
    if not ok and cost <= limit then retry = p1 end
    if commit and cost > 0 and v < MAX then
      local after = MAX
      if cost <= MAX - v then after = v + cost end
      local ttl = p1 - now
      if ttl < 0 then ttl = 0 end
      local b = 6 * i
      w[b - 5], w[b - 4], w[b - 3], w[b - 2], w[b - 1] =
        after, ttl + GRACE, after, p1, raw and now <= p1 and cost <= MAX - v
    end

  elseif kind == '2' then
    local bms, nb = p1, tonumber(ARGV[a + 2])
    local cur = floor(now / bms)
    local lo = cur - nb -- buckets below lo no longer count
    local h = redis.call('HGETALL', key)
    local newest -- highest live bucket holding units
    for j = 1, #h, 2 do
      local idx = tonumber(h[j])
      if idx >= lo then
        local u = tonumber(h[j + 1])
        used = used + u
        if u > 0 and (newest == nil or idx > newest) then newest = idx end
      end
    end
    ok = ok and used <= limit - cost
    if used > 0 and newest then resets = (newest + nb + 1) * bms end
    if not ok and cost <= limit then
      -- The oldest live bucket stops counting first: walk them in ascending order.
      local ids, units = {}, {}
      for j = 1, #h, 2 do
        local idx, u = tonumber(h[j]), tonumber(h[j + 1])
        if idx >= lo and u > 0 then ids[#ids + 1] = idx; units[idx] = u end
      end
      table.sort(ids)
      local rest = used
      for k = 1, #ids do
        rest = rest - units[ids[k]]
        if rest <= limit - cost then retry = (ids[k] + nb + 1) * bms; break end
      end
    end
    if commit and cost > 0 and used < MAX then
      local delta = MAX - used
      if cost < delta then delta = cost end
      local top = cur
      if newest and newest > cur then top = newest end
      local r = (top + nb + 1) * bms
      local b = 6 * i
      w[b - 5], w[b - 4], w[b - 3], w[b - 2], w[b - 1], w[b] =
        delta, r - now + GRACE, used + delta, r, h, lo
    end

  elseif kind == '5' then
    used = cost

  elseif kind == '6' then
    used = tonumber(redis.call('GET', key) or 0)
    ok = ok and used <= limit - cost
    resets = MAX -- never (the Rust side's NEVER_MS)
    if commit and cost > 0 and used < MAX then
      local after = MAX
      if cost <= MAX - used then after = used + cost end
      w[6 * i - 5], w[6 * i - 3], w[6 * i - 2] = after, after, MAX
    end

  elseif kind == '4' then
    local v, st, en = 0, now, p1
    local raw = redis.call('GET', key)
    if raw then
      local u0, s0, e0 = string.match(raw, '^(%d+):(-?%d+):(-?%d+)$')
      if not u0 then return redis.error_reply('WRONGTYPE zoned calendar value ' .. raw) end
      if now < tonumber(e0) then v, st, en = tonumber(u0), tonumber(s0), tonumber(e0) end
    end
    used = v
    ok = ok and v <= limit - cost
    if v > 0 then resets = en end
    if not ok and cost <= limit then retry = en end
    if commit and cost > 0 and v < MAX then
      local after = MAX
      if cost <= MAX - v then after = v + cost end
      local ttl = en - now
      if ttl < 0 then ttl = 0 end
      local b = 6 * i
      w[b - 5], w[b - 4], w[b - 3], w[b - 2] = fmt('%d:%d:%d', after, st, en), ttl + GRACE, after, en
    end

  else -- '3': token bucket (GCRA)
    local per = p1
    local rate = limit
    if rate < 1 then rate = 1 end -- a zero-limit bucket still drains, 1 unit of S per ms
    local s, tref = 0, now
    local raw = redis.call('GET', key)
    if raw then
      local sep = string.find(raw, ':', 1, true)
      s = tonumber(string.sub(raw, 1, sep - 1))
      local t = tonumber(string.sub(raw, sep + 1))
      if t > now then
        tref = t -- written by an instance whose clock runs ahead: nothing drained yet
      elseif (now - t) * rate >= s then
        s = 0
      else
        s = s - (now - t) * rate
      end
    end
    used = ceil(s / per)
    ok = ok and s <= (limit - cost) * per
    if s > 0 then resets = clamp(tref + ceil(s / rate)) end
    if not ok and cost <= limit then
      retry = clamp(tref + ceil((s - (limit - cost) * per) / rate))
    end
    if commit and cost > 0 and s < MAX then
      -- cost * per may not fit 2^53: compare through a division first (exact for integers).
      local after = MAX
      if cost <= floor((MAX - s) / per) then after = s + cost * per end
      local r = clamp(tref + ceil(after / rate))
      local b = 6 * i
      w[b - 5], w[b - 4], w[b - 3], w[b - 2], w[b - 1] =
        fmt('%d:%d', after, tref), clamp(r - now + GRACE), ceil(after / per), r, false
    end
  end

  if not ok and ARGV[a + 5] == '1' then out[1] = 0 end
  local o = 4 * i - 2
  out[o], out[o + 1], out[o + 2], out[o + 3] = used, ok and 1 or 0, resets, retry
end

-- Pass 2: the decision is allowed, apply every charge that changes something.
if commit and out[1] == 1 then
  for i = 1, n do
    local b = 6 * i
    local value = w[b - 5]
    if value ~= nil then
      local key = KEYS[i]
      local kind = ARGV[3 + 6 * (i - 1)]
      if kind == '2' then
        local h, lo = w[b - 1], w[b]
        local stale
        for j = 1, #h, 2 do
          if tonumber(h[j]) < lo then
            stale = stale or {}
            stale[#stale + 1] = h[j]
            if #stale == 200 then redis.call('HDEL', key, unpack(stale)); stale = {} end
          end
        end
        if stale and #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
        local cur = floor(now / tonumber(ARGV[3 + 6 * (i - 1) + 1]))
        redis.call('HINCRBY', key, fmt('%d', cur), fmt('%d', value))
        redis.call('PEXPIRE', key, fmt('%d', w[b - 4]))
      elseif kind == '1' and w[b - 1] then
        -- The key's TTL, set by its first charge, ends where this one's would: INCRBY keeps it.
        redis.call('INCRBY', key, ARGV[3 + 6 * (i - 1) + 4])
      elseif kind == '1' then
        redis.call('SET', key, fmt('%d', value), 'PX', fmt('%d', w[b - 4]))
      elseif kind == '6' then
        redis.call('SET', key, fmt('%d', value))
      else
        redis.call('SET', key, value, 'PX', fmt('%d', w[b - 4]))
      end
      local o = 4 * i - 2
      out[o], out[o + 2] = w[b - 3], w[b - 2]
    end
  end
end

-- Effects, in the same atomic step as the charges.
if commit and out[1] == 1 and has_intent then
  redis.call('SET', intent_key, 'open\n' .. epoch_now .. '\n' .. deadline .. '\n' .. intent_record,
    'PX', 600000)
  redis.call('ZADD', intents_key, deadline, attempt)
  redis.call('INCR', string.match(intent_key, '^(.*)#') .. '#xv')
elseif commit and out[1] == 1 and has_reservation then
  redis.call('SET', reservation_key, 'open\n' .. epoch_now, 'PX', 60000)
  redis.call('INCR', string.match(reservation_key, '^(.*)#') .. '#xv')
elseif commit and out[1] == 1 then
  local numbers = ''
  local allowed = allowed_entry
  if keeps_answer and not has_idem and on_crossing ~= '' then
    -- The answer is kept only to tell an alert: only when usage crossed a threshold.
    keeps_answer = false
    local at, i, level, sep = 1
    repeat
      i, level, sep, at = string.match(on_crossing, '^(%d+):(%d+)([,;])()', at)
      if not i then break end -- no level at all (every threshold of a limit of 0)
      i, level = tonumber(i), tonumber(level)
      local after = out[4 * i - 2]
      if after - tonumber(ARGV[3 + 6 * (i - 1) + 4]) < level and level <= after then
        keeps_answer = true
        allowed = allowed .. string.sub(on_crossing, string.find(on_crossing, ';', at - 1, true) + 1)
        break
      end
    until sep == ';'
  end
  if has_idem or keeps_answer then
    local nums = {}
    for j = 1, #out do nums[j] = fmt('%d', out[j]) end
    numbers = table.concat(nums, ',')
  end
  if has_idem then
    redis.call('SET', idem_key, idem_record .. '\n' .. numbers, 'PX', idem_ttl)
  end
  if has_totals and not keeps_answer then
    redis.call('HSET', totals_key, totals_id, allowed)
    redis.call('HSETNX', totals_key, '#', totals_id)
  elseif has_ledger then
    redis.call('XADD', stream_key, '*', 'e', allowed .. numbers)
  end
  if has_hold then
    redis.call('SET', hold_key, 'open\n' .. hold_record, 'PX', hold_ttl)
    redis.call('ZADD', index_key, hold_expiry, hold_id)
  end
elseif commit and has_ledger and denied_entry ~= '' and has_totals then
  redis.call('HSET', totals_key, totals_id .. '!', denied_entry)
  redis.call('HSETNX', totals_key, '#', totals_id)
elseif commit and has_ledger and denied_entry ~= '' then
  redis.call('XADD', stream_key, '*', 'e', denied_entry)
end

return out
