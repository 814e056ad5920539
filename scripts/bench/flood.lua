-- wrk script: consume.lua's requests, counting the answers by kind, for the overload rows.
--
--   wrk -t2 -c2000 -d10s -s flood.lua http://127.0.0.1:PORT/quota/consume -- ACTION SUBJECTS
--
-- done() prints one machine-readable line:
--   BENCH requests=N seconds=S rps=R p50_ms=X p99_ms=Y admitted_p99_ms=Z ok=A denied=D
--         overloaded=O unavailable=U other=T socket_errors=E
-- p50_ms and p99_ms are wrk's, over every answer (shed ones included); admitted_p99_ms is
-- over the 200 and 429 answers only, timed by this script: each request carries its send
-- time in X-Request-Id, which the service echoes. ok and denied are goodput (200 and 429);
-- overloaded is 503 with the overloaded problem type; unavailable is any other 503 (a
-- store taken for down).

local ffi = require("ffi")
ffi.cdef [[
  typedef struct { long tv_sec; long tv_nsec; } ql_timespec;
  int clock_gettime(int clock, ql_timespec *ts);
]]
local now_ts = ffi.new("ql_timespec")
-- Microseconds on the monotonic clock.
local function now_us()
  ffi.C.clock_gettime(1, now_ts)
  return tonumber(now_ts.tv_sec) * 1000000 + math.floor(tonumber(now_ts.tv_nsec) / 1000)
end

-- The histogram bucket of a latency: 0.1 ms wide below 100 ms, 1 ms wide above.
local function bucket(us)
  if us < 100000 then
    return math.floor(us / 100)
  end
  return 1000 + math.floor((us - 100000) / 1000)
end
-- The upper bound of a bucket, in ms.
local function bucket_ms(b)
  if b < 1000 then
    return (b + 1) / 10
  end
  return 100 + (b - 1000 + 1)
end

local count = 0
local threads = {}

function setup(thread)
  count = count + 1
  thread:set("id", count)
  table.insert(threads, thread)
end

function init(args)
  local action, subjects = args[1], tonumber(args[2])
  assert(action and subjects, "usage: -- ACTION SUBJECTS")
  n_subjects = subjects
  math.randomseed(os.time() * 1000 + id)
  head = '{"action":"' .. action .. '","subject":"u'
  tail = '"}'
  prefix = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port
    .. "\r\nContent-Type: application/json\r\nContent-Length: "
  ok, denied, overloaded, unavailable, other = 0, 0, 0, 0, 0
  admitted = {}
end

function request()
  local body = head .. math.random(1, n_subjects) .. tail
  return prefix .. #body .. "\r\nX-Request-Id: t" .. now_us() .. "\r\n\r\n" .. body
end

local function admitted_latency(headers)
  local id = headers["x-request-id"] or headers["X-Request-Id"]
  local sent = id and tonumber(id:match("^t(%d+)$"))
  if sent then
    local b = bucket(now_us() - sent)
    admitted[b] = (admitted[b] or 0) + 1
  end
end

function response(status, headers, body)
  if status == 200 then
    ok = ok + 1
    admitted_latency(headers)
  elseif status == 429 then
    denied = denied + 1
    admitted_latency(headers)
  elseif status == 503 and body and body:find("problem:overloaded", 1, true) then
    overloaded = overloaded + 1
  elseif status == 503 then
    unavailable = unavailable + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local totals = { ok = 0, denied = 0, overloaded = 0, unavailable = 0, other = 0 }
  for _, thread in ipairs(threads) do
    for key, _ in pairs(totals) do
      totals[key] = totals[key] + (thread:get(key) or 0)
    end
  end
  local merged, total = {}, 0
  for _, thread in ipairs(threads) do
    for b, n in pairs(thread:get("admitted") or {}) do
      merged[b] = (merged[b] or 0) + n
      total = total + n
    end
  end
  local keys = {}
  for b, _ in pairs(merged) do
    table.insert(keys, b)
  end
  table.sort(keys)
  local admitted_p99, seen = 0, 0
  for _, b in ipairs(keys) do
    seen = seen + merged[b]
    if seen >= 0.99 * total then
      admitted_p99 = bucket_ms(b)
      break
    end
  end
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "BENCH requests=%d seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f admitted_p99_ms=%.1f ok=%d denied=%d overloaded=%d unavailable=%d other=%d socket_errors=%d\n",
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, admitted_p99,
    totals.ok, totals.denied, totals.overloaded, totals.unavailable, totals.other,
    e.connect + e.read + e.write + e.timeout))
end
