-- wrk script for the soak (testbed/soak.py): the mix's requests, each answer checked against the
-- node's answer to that request.
--
--   wrk -t8 -c8 -d10s --timeout 30s -s loadtest/wrk/soak.lua http://127.0.0.1:18080 -- build/soak/requests.bin
--
-- One connection per thread (-c equal to -t): a thread's requests and answers then alternate, so
-- each answer is checked against the request it answers. Each connection asks with an id of its
-- own, so that an answer meant for another connection is wrong here. The file holds the requests,
-- each as six fields (framed.lua): the path, the Accept-Encoding ("-": none), and the body and
-- the node's answer each in two parts, before and after the id. Each thread takes the next
-- request of the list, round and round, from a place of its own.
--
-- A 200 is right when the body a client decodes is the node's answer, byte for byte: as it came,
-- or gzip (where asked for) decoded (gunzip.lua). Anything else with a 200 is wrong; other
-- statuses are counted as failed (the proxy said so), by the second (Unix time) they came in:
-- the soak allows them only while a fault is on. done() prints one RESULT line of JSON.
--
-- A response cut short never reaches response(), but wrk (4.1) keeps what it read of it, head
-- and body, and puts it before the next response's on the connection it opens again. So the
-- answer after a request that got none ("carried") is judged by its end only: the answer's bytes,
-- or a gzip member that decodes to them; the fault matrix's judged clients beside wrk read every
-- answer whole.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local gunzip, framed = dofile(here .. "gunzip.lua"), dofile(here .. "framed.lua")

local records = {}
local threads = {}
local current, next_record
local answered, carried, verifying = true, false, false
right, wrong, failed, carried_right, first_wrong = 0, 0, 0, 0, ""
-- the failures of the seconds before this one, "second:count," each, and this second's
failed_before, this_second, failed_this_second = "", 0, 0

function setup(thread)
  thread:set("offset", #threads)
  table.insert(threads, thread)
end

function init(args)
  local fields = framed.read(args[1])
  local id = tostring(1000 + offset)
  for at = 1, #fields, 6 do
    local path, coding, body_before, body_after, answer_before, answer_after = unpack(fields, at, at + 5)
    local headers = {["Content-Type"] = "application/json"}
    if coding ~= "-" then headers["Accept-Encoding"] = coding end
    table.insert(records, {request = wrk.format("POST", path, headers, body_before .. id .. body_after),
                           answer = answer_before .. id .. answer_after, gzip = coding:find("gzip") ~= nil,
                           path = path, coding = coding})
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

local function gunzips_to_answer(body, from)
  return gunzip.decode(body, from, #current.answer) == current.answer
end

local function is_answer(body, coding)
  if coding == nil or coding == "identity" then
    return body == current.answer
  end
  return coding == "gzip" and current.gzip and gunzips_to_answer(body, 1)
end

-- after what wrk carried over (its head too: the coding may be the cut response's): the answer,
-- or a gzip member from one of the places a member's header (ID1 ID2 CM) starts
local function ends_with_answer(body)
  if body:sub(-#current.answer) == current.answer then return true end
  if not current.gzip then return false end
  local at = body:find("\31\139\8", 1, true)
  while at do
    if gunzips_to_answer(body, at) then return true end
    at = body:find("\31\139\8", at + 1, true)
  end
  return false
end

local function count_failed()
  local now = os.time()
  if now ~= this_second then
    if failed_this_second > 0 then
      failed_before = failed_before .. this_second .. ":" .. failed_this_second .. ","
    end
    this_second, failed_this_second = now, 0
  end
  failed, failed_this_second = failed + 1, failed_this_second + 1
end

function response(status, headers, body)
  answered = true
  local after_cut = carried
  carried = false
  if status ~= 200 then
    count_failed()
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
  local example, failed_at = "", ""
  for _, thread in ipairs(threads) do
    for name in pairs(totals) do totals[name] = totals[name] + thread:get(name) end
    if example == "" then example = thread:get("first_wrong") end
    failed_at = failed_at .. thread:get("failed_before")
    if thread:get("failed_this_second") > 0 then
      failed_at = failed_at .. thread:get("this_second") .. ":" .. thread:get("failed_this_second") .. ","
    end
  end
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%.0f,"seconds":%f,"right":%.0f,"wrong":%.0f,"failed":%.0f,"carried_right":%.0f,' ..
    '"errors":{"connect":%.0f,"read":%.0f,"write":%.0f,"timeout":%.0f},"first_wrong":"%s","failed_at":"%s"}\n',
    summary.requests, summary.duration / 1e6, totals.right, totals.wrong, totals.failed, totals.carried_right,
    e.connect, e.read, e.write, e.timeout, (example:gsub("[%c\"\\]", "?")), failed_at))
end
