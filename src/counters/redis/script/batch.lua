--[[
batch.lua: several decisions of consume.lua in one call, each applied in order, each as
consume.lua applies it alone (counters/redis/batch.rs builds this script: consume.lua's
body becomes the function `one(KEYS, ARGV)` above this part).

KEYS      every decision's keys, in order
ARGV[1]   n, the count of decisions
then two values per decision i, at ARGV[2 * i] and ARGV[2 * i + 1]: the count of its keys
and the count of its arguments; then every decision's arguments, in order.

Returns one element per decision: its reply as consume.lua gives it, or { -9, message }
where it raised an error (what it wrote before the error stays, as it would alone); the
decisions after it are decided all the same.
]]

local count = tonumber(ARGV[1])
local replies = {}
local k, a = 1, 2 + 2 * count
for d = 1, count do
  local nk, na = tonumber(ARGV[2 * d]), tonumber(ARGV[2 * d + 1])
  local keys = { unpack(KEYS, k, k + nk - 1) }
  local args = { unpack(ARGV, a, a + na - 1) }
  k, a = k + nk, a + na
  local ok, reply = pcall(one, keys, args)
  if not ok then
    if type(reply) == 'table' then reply = reply.err end
    reply = { -9, tostring(reply) }
  elseif type(reply) == 'table' and reply.err then
    reply = { -9, reply.err }
  end
  replies[d] = reply
end
return replies
