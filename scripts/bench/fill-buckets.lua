--[[
Memory of a rolling policy whose every bucket is in use. After scripts/bench.sh has charged
each subject once through the service (one bucket per hash), this adds, to every rolling
counter matching ARGV[1], the W/B older buckets that a subject active all day would have,
named the way consume.lua names them (the decimal bucket index).

ARGV[1]  SCAN pattern of the rolling counters
ARGV[2]  how many older buckets to add (24 for W/B = 24, so 25 buckets count)
Returns the number of counters filled.
]]
local cursor, filled = '0', 0
local extra = tonumber(ARGV[2])
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = page[1]
  for _, key in ipairs(page[2]) do
    local newest = tonumber(redis.call('HKEYS', key)[1])
    for j = 1, extra do
      redis.call('HINCRBY', key, string.format('%d', newest - j), 1)
    end
    filled = filled + 1
  end
until cursor == '0'
return filled
