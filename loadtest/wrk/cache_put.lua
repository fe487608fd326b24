-- wrk script: stores entries in the cache daemon, each under a key of its own (a workload of
-- stores, never overwrites), for loadtest/cached_bench.py.
--
--   wrk -t2 -c8 -d8s -s loadtest/wrk/cache_put.lua http://127.0.0.1:18090 -- build/bench/cached/entries.bin
--
-- The file holds the entries as rpcedge_core::cache::encode lays them out, each a field of its own
-- (framed.lua). done() prints one RESULT line of JSON: stores, and answers other than 204.

local framed = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "framed.lua")
local entries = {}
local threads = {}
local thread_count = 0
stored, refused, sequence = 0, 0, 0

function setup(thread)
  thread:set("thread_index", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

function init(args)
  entries = framed.read(args[1])
  assert(#entries > 0, "no entries in " .. args[1])
end

function request()
  sequence = sequence + 1
  local key = string.format("%08x%08x%048x", thread_index, sequence, 0)
  return wrk.format("PUT", "/v1/entries/" .. key, nil, entries[sequence % #entries + 1])
end

function response(status, headers, body)
  if status == 204 then
    stored = stored + 1
  else
    refused = refused + 1
  end
end

function done(summary, latency, requests)
  local total_stored, total_refused = 0, 0
  for _, thread in ipairs(threads) do
    total_stored = total_stored + thread:get("stored")
    total_refused = total_refused + thread:get("refused")
  end
  io.write(string.format('RESULT {"stored":%d,"refused":%d,"seconds":%f}\n',
    total_stored, total_refused, summary.duration / 1e6))
end
