-- wrk script: POST a small JSON-RPC call (eth_blockNumber, a ~45-byte recorded answer).
-- wrk -t2 -c64 -d10s -s loadtest/replay/bench/eth_blockNumber.lua http://127.0.0.1:18545/
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}'

local mismatches = 0

function response(status, headers, body)
  if status ~= 200 or not body:find('"result"', 1, true) then
    mismatches = mismatches + 1
  end
end

function done(summary, latency, requests)
  -- Each wrk thread has its own Lua state, so only report what this state can see.
  io.write(string.format("non-result answers (last thread): %d\n", mismatches))
end
