-- wrk script: consume.lua's requests, counting the answers by kind, for the overload rows.
--
--   wrk -t2 -c2000 -d10s -s flood.lua http://127.0.0.1:PORT/quota/consume -- ACTION SUBJECTS
--
-- done() prints one machine-readable line (latencies of every answer, shed ones included):
--   BENCH requests=N seconds=S rps=R p50_ms=X p99_ms=Y ok=A denied=D overloaded=O
--         unavailable=U other=T socket_errors=E
-- ok and denied are goodput (200 and 429); overloaded is 503 with the overloaded problem
-- type; unavailable is any other 503 (a store taken for down).

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
end

function request()
  local body = head .. math.random(1, n_subjects) .. tail
  return prefix .. #body .. "\r\n\r\n" .. body
end

function response(status, headers, body)
  if status == 200 then
    ok = ok + 1
  elseif status == 429 then
    denied = denied + 1
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
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "BENCH requests=%d seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f ok=%d denied=%d overloaded=%d unavailable=%d other=%d socket_errors=%d\n",
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    totals.ok, totals.denied, totals.overloaded, totals.unavailable, totals.other,
    e.connect + e.read + e.write + e.timeout))
end
