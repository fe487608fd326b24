-- rpcedge for OpenResty: the core's exchange through LuaJIT FFI, so that Lua makes the very
-- decisions the nginx module makes (eligibility, size gate, level, Vary, ETag, exact length).
--
--     local rpcedge = require "resty.rpcedge"
--     local settings = rpcedge.settings('{"level": 6}')   -- once, e.g. at module load
--     ...
--     ngx.req.read_body()
--     local exchange = rpcedge.exchange(settings)
--     local res = exchange:capture("/__node")   -- the client's method, query, headers and body
--     exchange:respond(res)  -- status, headers and the body, compressed or not
--
-- A subrequest hands Lua the whole body, which is what lets it send an exact Content-Length.
--
-- Or, in a proxy_pass location, chunk by chunk as the body arrives:
--
--     access_by_lua_block        { require("resty.rpcedge").access(settings) }
--     proxy_pass http://node;
--     header_filter_by_lua_block { require("resty.rpcedge").header_filter() }
--     body_filter_by_lua_block   { require("resty.rpcedge").body_filter() }
--
-- The header filter must let the head go before any of the body is in (Lua cannot hold it, as
-- the nginx module does), so there an answer that would be compressed whole streams instead
-- (gzip, without a Content-Length), each chunk flushed as it is compressed, and nothing is
-- transcoded (SSZ needs the whole body before the head: use the subrequest form for it).
--
-- The response cache in rpcedge-cached, as nginx's module and Envoy use it: give the settings a
-- "cache" section whose "cluster" is this host's daemon's address ("unix:/path" or
-- "127.0.0.1:18090"; its other fields as Envoy's), and name each location's network:
--
--     local settings = rpcedge.settings('{"cache": {"cluster": "127.0.0.1:18090"}}')
--     ...
--     exchange:respond(exchange:capture("/__node", "mainnet"))
--     -- or, in the proxy_pass form:  rpcedge.access(settings, "mainnet")
--     log_by_lua_block { require("resty.rpcedge").log() }
--
-- The namespace (the second argument, else the section's "namespace"; neither: a BYPASS) is the
-- network whose node the location reaches, never anything the client sends. The daemon is asked
-- over cosockets before the node, within the section's timeout_ms (failing open: the node
-- answers, X-Rpcedge-Cache: ERROR); a hit is sent as it is, with its exact length; a batch's
-- calls that hit are taken out of what the node gets, and its answer merged back in the
-- client's order (in the proxy_pass form without a Content-Length: the head is out before the
-- merge); concurrent misses of one key wait for one answer (lock_timeout_ms). The
-- answer is stored from a timer once it has gone out. The log phase's call releases a key whose
-- request ended without an answer (its client went away); without it, the daemon lets the key
-- go at the lock's time. No hot tier here (hot_bytes is refused).
--
-- The response cache's key and decisions, for a config that keeps entries in its own storage
-- (a shared dict, Redis, ...) rather than in rpcedge-cached (settings without a cache section,
-- or with "enabled": false, whose limits then apply here):
--
--     local c = rpcedge.cache(settings, body, "mainnet")
--     -- settings: its "cache" section's max_request, max_entry and chain_ttl_s apply (without
--     -- one, their defaults); body: the request's; the namespace: the network this location's
--     -- node serves (never the client's Host or path; default: $server_name)
--     if c:key() then                          -- nil: the cache does not take this request
--         local entry = my_store:get(c:key())
--         local hit, coding = c:hit(entry, 1024) -- the client's own id spliced in; coded
--                                                 -- ("gzip", "zstd", "br") if it takes one
--         -- send hit with c:hit_headers() (Content-Type, Content-Encoding, Vary, the node's)
--     end
--     -- after the node answered (res from ngx.location.capture):
--     if c:response_head(res.status, #res.body, res.header) and not res.truncated then
--         local put = c:store(res.body)       -- nil: not kept (an error, a null, not final, ...)
--         -- put.entry under c:key(), for put.ttl seconds if set; put.requires_final: keep it
--         -- only once that block (a decimal number) or the block of that transaction (a hash)
--         -- is finalized in the namespace, and with put.block_hash only if that block has it
--     end
--
-- The counters every rpcedge host keeps (the core's names, as nginx's rpcedge_status and Envoy
-- print them) are kept in a lua_shared_dict, "rpcedge_counters" unless rpcedge.count_in(name)
-- names another (at module load); without that dict nothing is counted. respond and the cache's
-- calls count as they go; rpcedge.status() prints them, from a content handler:
--
--     lua_shared_dict rpcedge_counters 64k;
--     location = /rpcedge_status { content_by_lua_block { require("resty.rpcedge").status() } }
--
-- The dcz dictionary (RFC 9842), for settings whose "encodings" list "dcz", served as nginx's
-- rpcedge_dictionary serves it, with the RPC paths a client uses it for:
--
--     location = /rpcedge/dictionary { content_by_lua_block { require("resty.rpcedge").dictionary("/*") } }
--
-- The shared library is found by ffi.load: set RPCEDGE_LIB (env directive) to its path, or put
-- librpcedge.so where the dynamic linker looks.
--
-- The binding's modules, each requiring only those named before it: resty.rpcedge.abi (the
-- core through LuaJIT's FFI, the counters), resty.rpcedge.daemon (settings and their cache
-- daemon, the calls to it), resty.rpcedge.cache (the response cache of a request),
-- resty.rpcedge.exchange (the subrequest form), resty.rpcedge.filter (the proxy_pass form) and
-- resty.rpcedge.dictionary (the dcz dictionary's location); this module gathers their public
-- functions.

local abi = require "resty.rpcedge.abi"
local daemon = require "resty.rpcedge.daemon"
local cache = require "resty.rpcedge.cache"
local exchange = require "resty.rpcedge.exchange"
local filter = require "resty.rpcedge.filter"
local dictionary = require "resty.rpcedge.dictionary"

local _M = { version = "0.5.0" }

_M.count_in = abi.count_in
_M.status = abi.status
_M.settings = daemon.settings
_M.cache = cache.new
_M.exchange = exchange.new
_M.respond = exchange.respond
_M.access = filter.access
_M.header_filter = filter.header_filter
_M.body_filter = filter.body_filter
_M.log = filter.log
_M.dictionary = dictionary.serve

return _M
