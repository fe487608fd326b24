-- wrk script for loadtest/transcode_bench.py: posts one JSON-RPC call (or GETs the URL, for a
-- Beacon-API route) over and over, as a JSON or an SSZ client, and checks every answer.
--
--   wrk -t1 -c8 -d5s -s loadtest/wrk/transcode.lua http://127.0.0.1:18080/hoodi -- call.json application/octet-stream gzip 1810248
--
-- Arguments: the file with the request body ("-": a GET); the Accept value ("-": none); the Accept-Encoding
-- value ("-": none); the length every answer's body must have ("-": any, for a streamed body,
-- whose bytes follow its timing). done() prints one RESULT line of JSON: answers, broken ones
-- (status not 200, or another length), body bytes.

answered, broken, body_bytes = 0, 0, 0
expected_length = nil
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  local headers = {}
  if args[2] ~= "-" then headers["Accept"] = args[2] end
  if args[3] ~= "-" then headers["Accept-Encoding"] = args[3] end
  expected_length = tonumber(args[4])
  if args[1] == "-" then
    request_bytes = wrk.format("GET", nil, headers)
  else
    local file = assert(io.open(args[1], "rb"))
    local body = file:read("*a")
    file:close()
    headers["Content-Type"] = "application/json"
    request_bytes = wrk.format("POST", nil, headers, body)
  end
end

function request()
  return request_bytes
end

function response(status, headers, body)
  answered = answered + 1
  body_bytes = body_bytes + #body
  if status ~= 200 or #body == 0 or (expected_length and #body ~= expected_length) then
    broken = broken + 1
  end
end

function done(summary, latency, requests)
  local a, b, n = 0, 0, 0
  for _, thread in ipairs(threads) do
    a = a + thread:get("answered")
    b = b + thread:get("broken")
    n = n + thread:get("body_bytes")
  end
  io.write(string.format('RESULT {"answered":%d,"broken":%d,"body_bytes":%d,"seconds":%f,"p50_us":%d,"p99_us":%d}\n',
    a, b, n, summary.duration / 1e6, latency:percentile(50), latency:percentile(99)))
end
