-- wrk script for the soak (testbed/soak.py): the mix's requests, each answer checked against the
-- node's answer to that request.
--
--   wrk -t8 -c8 -d10s --timeout 30s -s loadtest/wrk/soak.lua http://127.0.0.1:18080 -- build/soak/requests.bin
--
-- One connection per thread (-c equal to -t): a thread's requests and answers then alternate, so
-- each answer is checked against the request it answers. The file holds the requests, each as
-- six fields (framed.lua): the path, the Accept-Encoding ("-": none), the body, the node's answer,
-- and that answer's CRC-32 and length in decimal. Each thread takes
-- the next request of the list, round and round, from a place of its own.
--
-- A 200 is right when its body is the node's answer: byte for byte where it came as it is; in
-- gzip (where asked for), when its trailer states the answer's CRC-32 and length, which a body
-- cut short does not (nor one the proxy compressed from other bytes; a cache hit's trailer comes
-- from the stored entry, so there the bytes are the judged clients' to check). Anything else with a 200 is wrong; other
-- statuses are counted as failed (the proxy said so). done() prints one RESULT line of JSON.
--
-- A response cut short never reaches response(), but wrk (4.1) keeps what it read of it, head
-- and body, and puts it before the next response's on the connection it opens again. So the
-- answer after a request that got none ("carried") is judged by its end only: the answer's bytes,
-- or a gzip trailer with its CRC-32 and length; the fault matrix's judged clients beside wrk
-- read every answer whole.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local sizes, framed = dofile(here .. "sizes.lua"), dofile(here .. "framed.lua")

local records = {}
local threads = {}
local current, next_record
local answered, carried, verifying = true, false, false
right, wrong, failed, carried_right, first_wrong = 0, 0, 0, 0, ""

function setup(thread)
  thread:set("offset", #threads)
  table.insert(threads, thread)
end

function init(args)
  local fields = framed.read(args[1])
  for at = 1, #fields, 6 do
    local path, coding, body, answer, crc, length = unpack(fields, at, at + 5)
    local headers = {["Content-Type"] = "application/json"}
    if coding ~= "-" then headers["Accept-Encoding"] = coding end
    table.insert(records, {request = wrk.format("POST", path, headers, body), answer = answer, crc = tonumber(crc),
                           length = tonumber(length), gzip = coding:find("gzip") ~= nil, path = path,
                           coding = coding})
  end
  assert(#records > 0, "no requests in " .. args[1])
  next_record = offset % #records
  verifying = offset == 0
end

function request()
  if verifying then
    -- wrk asks thread 0's script for one request before it sends any (to count pipelining)
    verifying = false
    return records[1].request
  end
  -- the previous request got no answer: the connection was cut, and wrk opened another
  carried = carried or not answered
  answered = false
  next_record = next_record % #records + 1
  current = records[next_record]
  return current.request
end

local function gzip_crc(body)
  local a, b, c, d = body:byte(-8, -5)
  return a + b * 256 + c * 65536 + d * 16777216
end

local function gzip_trailer_states_answer(body)
  return current.gzip and #body >= 18 and gzip_crc(body) == current.crc
    and sizes.gzip_isize(body) == current.length % 4294967296
end

local function is_answer(body, coding)
  if coding == nil or coding == "identity" then
    return body == current.answer
  end
  return coding == "gzip" and body:sub(1, 2) == "\31\139" and gzip_trailer_states_answer(body)
end

-- after what wrk carried over (its head too: the coding may be the cut response's)
local function ends_with_answer(body)
  return body:sub(-#current.answer) == current.answer or gzip_trailer_states_answer(body)
end

function response(status, headers, body)
  answered = true
  local after_cut = carried
  carried = false
  if status ~= 200 then
    failed = failed + 1
    return
  end
  local coding
  for name, value in pairs(headers) do
    if name:lower() == "content-encoding" then coding = value:lower() end
  end
  if after_cut and ends_with_answer(body) then
    right, carried_right = right + 1, carried_right + 1
  elseif not after_cut and is_answer(body, coding) then
    right = right + 1
  else
    wrong = wrong + 1
    if first_wrong == "" then
      first_wrong = string.format("%s, Accept-Encoding %s: %d B in %s", current.path, current.coding, #body,
                                  coding or "no coding")
    end
  end
end

function done(summary, latency, requests)
  local totals = {right = 0, wrong = 0, failed = 0, carried_right = 0}
  local example = ""
  for _, thread in ipairs(threads) do
    for name in pairs(totals) do totals[name] = totals[name] + thread:get(name) end
    if example == "" then example = thread:get("first_wrong") end
  end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%.0f,"seconds":%f,"right":%.0f,"wrong":%.0f,"failed":%.0f,"carried_right":%.0f,' ..
    '"errors":{"connect":%.0f,"read":%.0f,"write":%.0f,"timeout":%.0f},"first_wrong":"%s"}\n',
    summary.requests, summary.duration / 1e6, totals.right, totals.wrong, totals.failed, totals.carried_right,
    e.connect, e.read, e.write, e.timeout, (example:gsub("[%c\"\\]", "?"))))
end
