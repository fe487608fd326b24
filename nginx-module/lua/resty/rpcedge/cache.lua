-- resty.rpcedge.cache: the core's response cache for the current request: the Cache class (the
-- key and the decisions, for a config's own storage: rpcedge.cache), and the daemon form's handle
-- (asked before the node, stored and released behind the answer, found again in the log phase).

local ffi = require "ffi"
local abi = require "resty.rpcedge.abi"
local daemon = require "resty.rpcedge.daemon"

local C_string = ffi.string
local ffi_gc = ffi.gc
local ffi_new = ffi.new
local pairs = pairs
local ipairs = ipairs
local tostring = tostring
local tonumber = tonumber
local error = error
local setmetatable = setmetatable
local table_remove = table.remove
local io_open = io.open

local lib = abi.lib
local count, counts = abi.count, abi.counts
local rstr, lua_string = abi.rstr, abi.lua_string
local header_array, anchor = abi.header_array, abi.anchor
local daemon_call_of, daemon_call = daemon.daemon_call_of, daemon.daemon_call
local send_behind = daemon.send_behind
local CACHE_ASK, CACHE_HIT = abi.CACHE_ASK, abi.CACHE_HIT
local PASS_KEPT, PASS_HELD, PASS_MERGED = abi.PASS_KEPT, abi.PASS_HELD, abi.PASS_MERGED

local _M = {}


-- The daemon form's caches by request, for the log phase: by the request itself (its address,
-- which an internal redirect keeps where it wipes ngx.ctx; $request_id is made anew each time it
-- is read). Weakly: one collected first has left its key to orphans.
local in_flight = setmetatable({}, { __mode = "v" })
local get_request = require("resty.core.base").get_request

local function request_key()
    return tostring(get_request())
end

-- Keys held by requests whose cache was collected before it released them (the location has no
-- log_by_lua): released with this worker's next lookup, as nginx's module does; past
-- ORPHANS_MAX, left to the daemon's lock time.
local orphans, ORPHANS_MAX = {}, 16


-- The release of the key a cache handle still holds (daemon_call_of), or nil.
local function held_key(handle)
    local call = ffi_new("rpcedge_daemon_call_t")
    if lib.rpcedge_cache_release(handle, call) == 0 then
        return nil
    end
    return daemon_call_of(call)
end


-- The finalizer of a daemon-form cache handle: keeps the key it still holds for the next lookup
-- (to the daemon at `address`).
local function release_when_collected(address)
    return function(handle)
        local release = held_key(handle)
        if release and #orphans < ORPHANS_MAX then
            orphans[#orphans + 1] = { daemon = address, stores = {}, bytes = 0, release = release }
        end
        lib.rpcedge_cache_free(handle)
    end
end


local Cache = {}
Cache.__index = Cache


-- The core's cache exchange for the current request, whose body is `body`, in `namespace`, with
-- the client's `request_headers` (default: the request's now); `finalizer` (default: free it)
-- runs when the handle is collected.
local function new_cache(settings, body, namespace, request_headers, finalizer)
    -- every header (a stored answer may vary on any); `anchor` keeps the strings the array and
    -- the core's strings point to reachable through the call
    local headers, n, strings = header_array(request_headers or ngx.req.get_headers(0, true))
    local method, uri = ngx.req.get_method(), ngx.var.request_uri
    anchor[1], anchor[2] = strings, { namespace, method, uri }
    local handle = lib.rpcedge_cache_new(settings, rstr(namespace), rstr(method), rstr(uri),
                                         body, body and #body or 0, headers, n)
    anchor[1], anchor[2] = nil, nil
    if handle == nil then
        error("rpcedge: the cache could not take the request", 3)
    end
    return setmetatable({ handle = ffi_gc(handle, finalizer or lib.rpcedge_cache_free), body = body }, Cache)
end


-- The cache's view of the current request under `settings` (rpcedge.settings: the limits of its
-- "cache" section), whose body is `body` (nil when it is not held whole: a BYPASS). `namespace`
-- names where the request is routed, as the configuration says (one per network); it defaults to
-- the server block's first server_name. Never pass anything the client sends (its Host, its
-- path): a client must not choose where its answers are stored. Without either, the request
-- bypasses the cache.
function _M.new(settings, body, namespace)
    if namespace == nil and ngx.var.server_name ~= "" then
        namespace = ngx.var.server_name
    end
    return new_cache(settings, body, namespace)
end


-- The key (64 hex digits), or nil when the cache does not take the request. A batch is split
-- by the daemon's multi-key lookup (nginx's C module, Envoy): with this binding's own storage
-- it goes to the node whole.
function Cache:key()
    if self.looked_up then
        return self.looked_up
    end
    local key = ffi_new("rpcedge_str_t")
    if lib.rpcedge_cache_key(self.handle, key) == 0 then
        return nil
    end
    self.looked_up = lua_string(key)
    return self.looked_up
end


-- An entry from storage (nil: none) as the answer to this request: the body to send and whether
-- its Content-Encoding ("gzip", "zstd", "br"; nil: plain), or nil when the node must answer (no
-- entry, or a bad one).
function Cache:hit(entry, min_length)
    if lib.rpcedge_cache_found(self.handle, entry, entry and #entry or 0, min_length or 1024) == 0 then
        return nil
    end
    count(lib.rpcedge_count_cache(self.handle, counts))
    local body = ffi_new("rpcedge_str_t")
    local coding = lib.rpcedge_cache_hit(self.handle, nil, body)
    return lua_string(body), coding ~= 0 and lua_string(lib.rpcedge_coding_token(coding)) or nil
end


-- The hit's headers, as a list of { name, value }: Content-Type, Content-Encoding when coded,
-- Vary, then the node's that the entry kept. Send them all with the hit, and its length.
function Cache:hit_headers()
    local headers, name, value = {}, ffi_new("rpcedge_str_t"), ffi_new("rpcedge_str_t")
    while lib.rpcedge_cache_hit_header(self.handle, #headers, name, value) == 1 do
        headers[#headers + 1] = { lua_string(name), lua_string(value) }
    end
    return headers
end


-- The node's response head, its status, length (nil: unknown) and headers (a table as
-- ngx.location.capture's `res.header`): whether to keep its body for `store`. Call it for every
-- answer the node gives (a bypass too): it counts the request's cache status.
function Cache:response_head(status, content_length, headers)
    local array, n, strings = header_array(headers or {})
    anchor[1] = strings
    local take = lib.rpcedge_cache_response_head(self.handle, status, content_length or -1, array, n) == 1
    anchor[1] = nil
    count(lib.rpcedge_count_cache(self.handle, counts))
    if not take then
        -- the head may say already why the answer is not kept
        count(lib.rpcedge_count_refusal(self.handle, counts))
    end
    return take
end


-- The node's whole plain body: what to keep, or nil. `entry` goes into storage under the key;
-- `ttl` (seconds), `requires_final` (a block number, or a transaction hash whose block must be
-- final) and `block_hash` (the hash that block must have, as the answer names it) are nil when they
-- do not apply. The
-- entry's result is compressed here, once, in each form a hit splices (rpcedge-cached does it
-- when it is the storage), so that no hit compresses.
function Cache:store(body)
    if not self:key() then
        -- a batch: its answers are stored by the daemon's hosts
        return nil
    end
    local kept = ffi_new("rpcedge_kept_entry_t")
    if lib.rpcedge_cache_keep(self.handle, body, #body, kept) == 0 then
        count(lib.rpcedge_count_refusal(self.handle, counts))
        return nil
    end
    return {
        entry = lua_string(kept.entry),
        ttl = kept.ttl_s ~= 0 and tonumber(kept.ttl_s) or nil,
        requires_final = lua_string(kept.requires_final),
        block_hash = lua_string(kept.block_hash),
    }
end


-- Whether the node's answer may be kept: the request is no bypass.
function Cache:may_keep()
    return lib.rpcedge_cache_may_keep(self.handle) ~= 0
end


-- HIT, MISS, BYPASS, EXPIRED or ERROR; with `reasons`, a bypass with its reason
-- ("BYPASS; reason=method").
function Cache:status(reasons)
    local status = lib.rpcedge_cache_status(self.handle, reasons and 1 or 0)
    return C_string(status.data, status.len)
end


-- The request body, read: from memory, or from the file nginx wrote one longer than
-- client_body_buffer_size to, when the cache takes its length; else nil (a BYPASS).
local function request_body(settings)
    local body = ngx.req.get_body_data()
    local path = body == nil and ngx.req.get_body_file()
    if not path then
        return body
    end
    local file = io_open(path, "rb")
    if not file then
        return nil
    end
    if lib.rpcedge_cache_takes_length(settings, file:seek("end")) ~= 0 then
        file:seek("set")
        body = file:read("*a")
    end
    file:close()
    return body
end


-- The daemon form: the current request's cache exchange, when `settings` have a cache section,
-- in `namespace` (or the section's), with the body it is looked up by (read here, when a POST's
-- length lets it be looked up at all) and the client's `request_headers` (as it sent them, not
-- as ask_upstream made them for the node); nil without a section.
local function daemon_cache(settings, namespace, request_headers)
    local config = daemon.of(settings)
    if config == nil then
        return nil
    end
    while #orphans > 0 do
        send_behind(table_remove(orphans))
    end
    local body
    if ngx.req.get_method() == "POST" then
        local length = tonumber(ngx.var.content_length)
        if length == nil or lib.rpcedge_cache_takes_length(settings, length) ~= 0 then
            ngx.req.read_body()
            body = request_body(settings)
        end
    end
    local cache = new_cache(settings, body, namespace or config.ns, request_headers,
                            release_when_collected(config.address))
    cache.daemon_config = config
    -- the log phase ends what the answer did not (its client went away)
    ngx.ctx.rpcedge_cache, cache.request_key = cache, request_key()
    in_flight[cache.request_key] = cache
    return cache
end
_M.daemon_cache = daemon_cache


-- The daemon form's cache of the current request, for the log phase: ngx.ctx's, else the one in
-- flight by the request itself (an internal redirect wipes ngx.ctx); nil without one.
function _M.of_request()
    return ngx.ctx.rpcedge_cache or in_flight[request_key()]
end


-- Takes the steps the core gives, asking the daemon each lookup it names: true on a hit; else
-- false, and the body the node gets in place of the client's (a batch less the calls the cache
-- answered), or nil for the client's own. A lookup that fails (no daemon, no answer in time)
-- fails open: the node answers.
function Cache:lookup()
    local handle, min_length = self.handle, self.daemon_config.min_length
    local next_step = ffi_new("rpcedge_cache_next_t")
    local step = lib.rpcedge_cache_look_up(handle, nil, 0, min_length, next_step)
    while step == CACHE_ASK do
        local status, found, answer = daemon_call(self.daemon_config.address, daemon_call_of(next_step.call))
        if status then
            local headers, n, strings = header_array(found)
            anchor[1] = strings
            step = lib.rpcedge_cache_looked_up(handle, status, headers, n, answer, #answer, nil, 0, min_length,
                                               next_step)
            anchor[1] = nil
        else
            ngx.log(ngx.INFO, "rpcedge cache: lookup failed: ", found)
            step = lib.rpcedge_cache_looked_up(handle, 0, nil, 0, nil, 0, nil, 0, 0, next_step)
        end
    end
    if step == CACHE_HIT then
        return true
    end
    local body = next_step.node_body
    return false, body.data ~= nil and lua_string(body) or nil
end


-- The hit as a response: status, headers (a table as `res.header`) and body.
function Cache:hit_response()
    count(lib.rpcedge_count_cache(self.handle, counts))
    local status, body = ffi_new("uint16_t[1]"), ffi_new("rpcedge_str_t")
    lib.rpcedge_cache_hit(self.handle, status, body)
    local header = {}
    for _, h in ipairs(self:hit_headers()) do
        header[h[1]] = h[2]
    end
    return { status = status[0], header = header, body = lua_string(body) or "", cached = true }
end


-- Sends the hit whole, with its exact length, untouched by the exchange.
function Cache:send_hit(res)
    ngx.status = res.status
    for name, value in pairs(res.header) do
        ngx.header[name] = value
    end
    ngx.header["Content-Length"] = #res.body
    self:mark_status()
    ngx.print(res.body)
end


-- X-Rpcedge-Cache on the answer, where the settings ask for it.
function Cache:mark_status()
    if self.daemon_config.status_header then
        ngx.header["X-Rpcedge-Cache"] = self:status(self.daemon_config.status_reason)
    end
end


-- The node's head: whether its body is held (for the store, or to merge a batch's answers).
function Cache:head(status, content_length, headers)
    self.holding = self:response_head(status, content_length, headers)
    self.replacing = lib.rpcedge_cache_replaces_body(self.handle) ~= 0
end


-- A piece of the node's body (`eof`: its last): what goes on in its place. The core holds the
-- plain body for the store while it may keep it; a split batch's answer is held until it ends (or
-- is too long to hold), and the client gets it merged with the cache's in its own order.
function Cache:pass(chunk, eof)
    if not self.holding then
        return chunk
    end
    local merged = ffi_new("rpcedge_str_t")
    local passed = lib.rpcedge_cache_pass(self.handle, chunk, #chunk, eof and 1 or 0, merged)
    if passed == PASS_HELD then
        return ""
    end
    if passed == PASS_MERGED then
        -- past what was held, the rest passes on and nothing is stored; a whole answer's stores
        -- were taken as it was merged
        self.replacing, self.holding = false, eof
        return lua_string(merged) or ""
    end
    self.holding = passed == PASS_KEPT
    return chunk
end


-- The answer has gone out (or the request is over without one): its stores, and the release of
-- a key held without one, go to the daemon from a timer; why an answer was not kept is counted.
function Cache:ended()
    if self.done then
        return
    end
    self.done = true
    if self.request_key and in_flight[self.request_key] == self then
        in_flight[self.request_key] = nil
    end
    local stores = {}
    if self.holding then
        local call = ffi_new("rpcedge_daemon_call_t")
        local more = lib.rpcedge_cache_store(self.handle, call) ~= 0
        while more do
            stores[#stores + 1] = daemon_call_of(call)
            more = lib.rpcedge_cache_next_store(self.handle, call) ~= 0
        end
    end
    self.holding = false
    repeat
        local n = lib.rpcedge_count_refusal(self.handle, counts)
        count(n)
    until n == 0
    local release = held_key(self.handle)
    if #stores > 0 or release then
        local bytes = 0
        for _, put in ipairs(stores) do
            bytes = bytes + #(put.body or "")
        end
        send_behind({ daemon = self.daemon_config.address, stores = stores, release = release, bytes = bytes })
    end
end


return _M
