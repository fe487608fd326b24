-- wrk script: replays a request list written by testbed/scenarios.py and checks every answer.
--
--   wrk -t1 -c32 -d5s -s loadtest/wrk/replay.lua http://127.0.0.1:18080 -- build/bench/requests/mix.tsv gzip
--
-- Arguments: the list (one request per line, tab-separated: network, the recording that answers
-- it, the length of that answer, the compact JSON-RPC body), the Accept-Encoding to send and,
-- optionally, one more request header ("Name: value"). Each connection takes the next request of
-- the list, round and round.
--
-- A response counts as broken when its status is not 200, when it carries no X-Replay-Recording
-- naming a request of the list, when an identity body does not have the recorded length, when a
-- gzip body lacks the gzip magic or its trailer (ISIZE) disagrees with the recorded length, when a
-- zstd body lacks zstd's magic or its frame states another length, when a br body is empty, or
-- when it has any other Content-Encoding. A cache hit (X-Rpcedge-Cache: HIT)
-- counts as `cached`; one without a recording (the node's head was not kept) must have the length
-- (or gzip trailer) of one of the list's answers. done() prints one RESULT line of JSON for
-- loadtest/bench.py; wrk's own summary is printed above it.

requests = {}
expected = {}  -- recording -> length of its answer
lengths = {}  -- length of an answer of the list -> true
next_request = 0
-- counters, globals so that done() can read each thread's with thread:get()
answered, bad_status, unknown, bad_length, bad_gzip, bad_zstd, bad_br, bad_coding, encoded, cached, body_bytes =
  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  local list, accept_encoding, extra = args[1], args[2], args[3]
  local extra_name, extra_value
  if extra then
    extra_name, extra_value = extra:match("^([^:]+):%s*(.*)$")
    assert(extra_name, "a header is Name: value, got " .. extra)
  end
  for line in io.lines(list) do
    local network, recording, length, body = line:match("^([^\t]+)\t([^\t]+)\t(%d+)\t(.+)$")
    expected[recording] = tonumber(length)
    lengths[tonumber(length)] = true
    local headers = {["Content-Type"] = "application/json", ["Accept-Encoding"] = accept_encoding}
    if extra_name then headers[extra_name] = extra_value end
    table.insert(requests, wrk.format("POST", "/" .. network, headers, body))
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

-- Whether a decoded length (or a gzip trailer's, modulo 2^32) is the recorded answer's; for a
-- cache hit (no recording), any answer's of the list.
local function fits(n, length)
  if length then return n == length % 4294967296 end
  return lengths[n] == true
end

function response(status, headers, body)
  answered = answered + 1
  body_bytes = body_bytes + #body
  if status ~= 200 then
    bad_status = bad_status + 1
    return
  end
  local recording, coding, cache
  for name, value in pairs(headers) do
    local lower = name:lower()
    if lower == "x-replay-recording" then
      recording = value
    elseif lower == "content-encoding" then
      coding = value
    elseif lower == "x-rpcedge-cache" then
      cache = value
    end
  end
  if cache == "HIT" then cached = cached + 1 end
  local length = recording and expected[recording]
  if not length and cache ~= "HIT" then
    unknown = unknown + 1
    return
  end
  if coding == nil then
    if not fits(#body, length) then bad_length = bad_length + 1 end
  elseif coding == "gzip" then
    encoded = encoded + 1
    if #body < 18 or body:sub(1, 2) ~= "\31\139" or not fits(gzip_isize(body), length) then
      bad_gzip = bad_gzip + 1
    end
  elseif coding == "zstd" then
    encoded = encoded + 1
    local size = #body >= 6 and body:sub(1, 4) == "\40\181\47\253" and zstd_size(body)
    if size == false or (size and not fits(size, length)) then bad_zstd = bad_zstd + 1 end
  elseif coding == "br" then
    encoded = encoded + 1
    if #body == 0 then bad_br = bad_br + 1 end
  else
    bad_coding = bad_coding + 1
  end
end

function done(summary, latency, requests)
  local totals = {}
  for _, name in ipairs({"answered", "bad_status", "unknown", "bad_length", "bad_gzip", "bad_zstd", "bad_br", "bad_coding", "encoded", "cached", "body_bytes"}) do
    local sum = 0
    for _, thread in ipairs(threads) do sum = sum + thread:get(name) end
    table.insert(totals, string.format('"%s":%.0f', name, sum))
  end
  local percentiles = {}
  for _, p in ipairs({50, 90, 99, 99.9}) do
    table.insert(percentiles, string.format('"%s":%.0f', tostring(p), latency:percentile(p)))
  end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%.0f,"duration_us":%.0f,"bytes":%.0f,' ..
    '"errors":{"connect":%.0f,"read":%.0f,"write":%.0f,"timeout":%.0f,"status":%.0f},' ..
    '"latency_us":{%s},"checks":{%s}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.timeout, e.status,
    table.concat(percentiles, ","), table.concat(totals, ",")))
end
