-- wrk script for loadtest/cache_bench.py: replays a request list and checks every answer.
--
--   wrk -t1 -c16 -d5s -s loadtest/wrk/cache_mix.lua http://127.0.0.1:18080 -- build/bench/cache/hit.tsv HIT
--
-- Arguments: the list (one request per line, tab-separated: method, path, the length of the
-- answer once decoded, the body or "-" for none), the X-Rpcedge-Cache statuses an answer may
-- carry, comma-separated ("-": none, as from a static file or an Envoy direct_response; a miss
-- that found its key in flight is COALESCED), and optionally the Accept-Encoding to send (default
-- gzip; "identity" for a client without gzip) and one more request header ("Name: value"). Each
-- connection takes the next request of the list, round and round.
--
-- A response counts as broken when its status is not 200, its cache status is not the one
-- expected (ERROR, the daemon too slow under the load, is counted apart: the node answered), or
-- its body does not have the expected length (gzip: magic and ISIZE; zstd: magic and the frame's
-- content size; br, which states none: not empty). done() prints one RESULT
-- line of JSON.

requests = {}
lengths = {}
next_request = 0
answered, bad_status, bad_cache, fail_open, bad_body, encoded, body_bytes = 0, 0, 0, 0, 0, 0, 0
expected_statuses = {}

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  local list, statuses, coding, extra = args[1], args[2], args[3] or "gzip", args[4]
  for status in statuses:gmatch("[^,]+") do expected_statuses[status] = true end
  local extra_name, extra_value
  if extra then
    extra_name, extra_value = extra:match("^([^:]+):%s*(.*)$")
    assert(extra_name, "a header is Name: value, got " .. extra)
  end
  for line in io.lines(list) do
    local method, path, length, body = line:match("^([^\t]+)\t([^\t]+)\t(%d+)\t(.+)$")
    local headers = {["Accept-Encoding"] = coding}
    if extra_name then headers[extra_name] = extra_value end
    if body == "-" then
      body = nil
    else
      headers["Content-Type"] = "application/json"
    end
    table.insert(requests, wrk.format(method, path, headers, body))
    table.insert(lengths, tonumber(length))
  end
  assert(#requests > 0, "no requests in " .. list)
end

function request()
  next_request = next_request % #requests + 1
  return requests[next_request]
end

-- gzip's and zstd's stated lengths, from beside this script
local sizes = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "sizes.lua")
local gzip_isize, zstd_size = sizes.gzip_isize, sizes.zstd_size

function response(status, headers, body)
  answered = answered + 1
  body_bytes = body_bytes + #body
  if status ~= 200 then
    bad_status = bad_status + 1
    return
  end
  local cache, coding = "-", nil
  for name, value in pairs(headers) do
    local lower = name:lower()
    if lower == "x-rpcedge-cache" then cache = value elseif lower == "content-encoding" then coding = value end
  end
  if cache == "ERROR" then
    fail_open = fail_open + 1
  elseif not expected_statuses[cache] then
    bad_cache = bad_cache + 1
  end
  -- lengths differ across the list: a body must have one of them
  local length
  if coding == "gzip" then
    encoded = encoded + 1
    if #body < 18 or body:sub(1, 2) ~= "\31\139" then bad_body = bad_body + 1 return end
    length = gzip_isize(body)
  elseif coding == "zstd" then
    encoded = encoded + 1
    length = #body >= 6 and body:sub(1, 4) == "\40\181\47\253" and zstd_size(body)
    if not length then bad_body = bad_body + 1 return end
  elseif coding == "br" then
    -- brotli states no length: a body at all
    encoded = encoded + 1
    if #body == 0 then bad_body = bad_body + 1 end
    return
  elseif coding == nil then
    length = #body
  else
    bad_body = bad_body + 1
    return
  end
  if not known_lengths then
    known_lengths = {}
    for _, l in ipairs(lengths) do known_lengths[l] = true end
  end
  if not known_lengths[length] then bad_body = bad_body + 1 end
end

function done(summary, latency, requests)
  local totals = {}
  for _, name in ipairs({"answered", "bad_status", "bad_cache", "fail_open", "bad_body", "encoded", "body_bytes"}) do
    local sum = 0
    for _, thread in ipairs(threads) do sum = sum + thread:get(name) end
    table.insert(totals, string.format('"%s":%.0f', name, sum))
  end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%.0f,"duration_us":%.0f,"bytes":%.0f,' ..
    '"errors":{"connect":%.0f,"read":%.0f,"write":%.0f,"timeout":%.0f,"status":%.0f},' ..
    '"latency_us":{"50":%.0f,"99":%.0f},"checks":{%s}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), table.concat(totals, ",")))
end
