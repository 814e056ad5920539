-- wrk script: POST /quota/consume once for each subject "u1" .. "u<SUBJECTS>", then stop.
--
--   wrk -tT -cC -dD -s fill.lua http://127.0.0.1:PORT/quota/consume -- ACTION SUBJECTS T
--
-- Thread i of T sends u<i>, u<i+T>, u<i+2T>, ...; once past SUBJECTS it stops and repeats its
-- last subject (which adds no key). Used to measure Redis memory per subject.

local count = 0

function setup(thread)
  count = count + 1
  thread:set("id", count)
end

function init(args)
  action, last, step = args[1], tonumber(args[2]), tonumber(args[3])
  assert(action and last and step, "usage: -- ACTION SUBJECTS THREADS")
  nxt, prev = id, id
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  local subject = nxt
  if subject > last then
    wrk.thread:stop()
    subject = prev
  else
    prev, nxt = subject, subject + step
  end
  return wrk.format(nil, nil, nil,
    '{"action":"' .. action .. '","subject":"u' .. subject .. '"}')
end

function done(summary)
  io.write(string.format("FILL requests=%d non2xx=%d\n", summary.requests, summary.errors.status))
end
