-- wrk script: POST /quota/consume for a random subject "u<n>", n uniform in [1, SUBJECTS].
--
--   wrk -t2 -c50 -d10s -s consume.lua http://127.0.0.1:PORT/quota/consume -- ACTION SUBJECTS [AMOUNT [COUNTRIES [TOKEN]]]
--
-- AMOUNT "" is the default amount (1). COUNTRIES, a comma-separated list of country codes
-- ("NG,IN,US"), adds "attributes":{"country":"<C>"} to every body, C uniform in the list:
-- the budgets scoped by country are then few and hot (budgets shared by subjects). TOKEN,
-- when given, is sent as every request's bearer token (an API key).
--
-- done() prints one machine-readable line (latencies in milliseconds):
--   BENCH requests=N seconds=S rps=R p50_ms=X p99_ms=Y socket_errors=E non2xx=M
-- A 429 counts as non-2xx: the benchmark's limits are set so that nothing is denied.

local count = 0

function setup(thread)
  count = count + 1
  thread:set("id", count)
end

function init(args)
  local action, subjects, amount, countries, token = args[1], tonumber(args[2]), args[3], args[4], args[5]
  assert(action and subjects, "usage: -- ACTION SUBJECTS [AMOUNT [COUNTRIES [TOKEN]]]")
  n_subjects = subjects
  math.randomseed(os.time() * 1000 + id)
  if amount == "" then amount = nil end
  head = '{"action":"' .. action .. '","subject":"u'
  tail = amount and ('","amount":' .. amount .. '}') or '"}'
  -- One tail per country, built once: a request only picks one.
  if countries and countries ~= "" then
    tails = {}
    for country in countries:gmatch("[^,]+") do
      tails[#tails + 1] = '","attributes":{"country":"' .. country .. '"'
        .. (amount and ('},"amount":' .. amount .. '}') or '}}')
    end
    n_tails = #tails
  end
  -- The request line and headers are written once: wrk.format per request (a table of
  -- headers, string.format per line) would cost the load generator more CPU than the body.
  prefix = "POST " .. wrk.path .. " HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port
    .. ((token and token ~= "") and ("\r\nAuthorization: Bearer " .. token) or "")
    .. "\r\nContent-Type: application/json\r\nContent-Length: "
end

function request()
  local body
  if tails then
    body = head .. math.random(1, n_subjects) .. tails[math.random(1, n_tails)]
  else
    body = head .. math.random(1, n_subjects) .. tail
  end
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
