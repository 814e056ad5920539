-- wrk script: POST /check_and_report to the Limitador peer (scripts/bench/limitador/) for a
-- random subject "u<n>", n uniform in [1, SUBJECTS]: what consume.lua sends the service,
-- in limitador-server's body.
--
--   wrk -t2 -c50 -d10s -s limitador.lua http://127.0.0.1:PORT/check_and_report -- NAMESPACE SUBJECTS
--
-- done() prints the same machine-readable line as consume.lua (latencies in milliseconds):
--   BENCH requests=N seconds=S rps=R p50_ms=X p99_ms=Y socket_errors=E non2xx=M
-- A 429 counts as non-2xx: the benchmark's limits are set so that nothing is denied.

local count = 0

function setup(thread)
  count = count + 1
  thread:set("id", count)
end

function init(args)
  local namespace, subjects = args[1], tonumber(args[2])
  assert(namespace and subjects, "usage: -- NAMESPACE SUBJECTS")
  n_subjects = subjects
  math.randomseed(os.time() * 1000 + id)
  head = '{"namespace":"' .. namespace .. '","values":{"subject":"u'
  tail = '"},"delta":1}'
  -- The request line and headers are written once, as in consume.lua.
  prefix = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port
    .. "\r\nContent-Type: application/json\r\nContent-Length: "
end

function request()
  local body = head .. math.random(1, n_subjects) .. tail
  return prefix .. #body .. "\r\n\r\n" .. body
end

function done(summary, latency, requests)
  local e = summary.errors
  local seconds = summary.duration / 1e6
  io.write(string.format(
    "BENCH requests=%d seconds=%.3f rps=%.1f p50_ms=%.3f p99_ms=%.3f socket_errors=%d non2xx=%d\n",
    summary.requests, seconds, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    e.connect + e.read + e.write + e.timeout, e.status))
end
