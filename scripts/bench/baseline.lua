--[[
The baseline that scripts/bench.sh runs with redis-benchmark: the least a Redis-backed
quota check can do, one atomic check-and-charge of one counter, with no HTTP, no JSON and
no window math. quota-ledger's consume.lua does the same for a calendar policy (plus the
reporting of usage, reset time and retry time).

KEYS[1]  the counter
ARGV[1]  limit
ARGV[2]  cost
ARGV[3]  TTL in milliseconds
Returns 1 (allowed and charged) or 0 (denied, nothing charged).
]]
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local cost = tonumber(ARGV[2])
if used + cost > tonumber(ARGV[1]) then
  return 0
end
redis.call('INCRBY', KEYS[1], cost)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
