-- resty.rpcedge.exchange: the core's exchange of one response: the Exchange class of the
-- subrequest form (rpcedge.exchange: ask_upstream, capture, respond) and rpcedge.respond, and
-- what the proxy_pass form takes from it (new_exchange, ask_identity, the head's edits).

local ffi = require "ffi"
local abi = require "resty.rpcedge.abi"
local cache_module = require "resty.rpcedge.cache"

local C_string = ffi.string
local ffi_gc = ffi.gc
local ffi_new = ffi.new
local bit_band = bit.band
local pairs = pairs
local ipairs = ipairs
local type = type
local tostring = tostring
local tonumber = tonumber
local setmetatable = setmetatable
local os_clock = os.clock

local lib = abi.lib
local count, counts = abi.count, abi.counts
local PLAN_PASS = abi.PLAN_PASS
local EDIT_SET, EDIT_REMOVE = abi.EDIT_SET, abi.EDIT_REMOVE
local OUT_HEADERS, OUT_MORE = abi.OUT_HEADERS, abi.OUT_MORE
local FEED_END = abi.FEED_END
local TRANSCODE_REFUSED = abi.TRANSCODE_REFUSED
local daemon_cache = cache_module.daemon_cache

-- not copied from the node's answer: the framing is this response's own
local HOP_BY_HOP = {
    ["content-length"] = true, ["transfer-encoding"] = true, ["connection"] = true,
    ["keep-alive"] = true, ["trailer"] = true, ["upgrade"] = true,
}

local _M = {}


-- Gives the core a table of headers (name -> value, or a list of values for a repeated one), one
-- field at a time, through `feed` (the request's or the response's).
local function feed_headers(exchange, feed, headers)
    for name, value in pairs(headers) do
        if type(value) ~= "table" then
            value = { value }
        end
        for _, v in ipairs(value) do
            v = tostring(v)
            feed(exchange, name, #name, v, #v)
        end
    end
end
_M.feed_headers = feed_headers


local function add_vary(name)
    local vary = ngx.header["Vary"]
    if vary == nil then
        ngx.header["Vary"] = name
    elseif type(vary) == "table" then
        vary[#vary + 1] = name
        ngx.header["Vary"] = vary
    else
        ngx.header["Vary"] = { vary, name }
    end
end


-- The core's edits of the answer's head, on ngx.header; `length`: its Content-Length, unless the
-- edits set or drop it.
local function apply_edits(edits, length)
    if edits.remove_content_encoding ~= 0 then
        ngx.header["Content-Encoding"] = nil
    end
    if edits.content_encoding.data ~= nil then
        ngx.header["Content-Encoding"] = C_string(edits.content_encoding.data, edits.content_encoding.len)
    end
    if edits.content_length_op == EDIT_SET then
        length = tonumber(edits.content_length)
    elseif edits.content_length_op == EDIT_REMOVE then
        length = nil
    end
    ngx.header["Content-Length"] = length
    -- Vary's values in the core's order (HeaderEdits::operations): Accept, then Accept-Encoding,
    -- in one field line
    local accept, encoding = edits.add_vary_accept ~= 0, edits.add_vary ~= 0
    if accept and encoding then
        add_vary("Accept, Accept-Encoding")
    elseif accept then
        add_vary("Accept")
    elseif encoding then
        add_vary("Accept-Encoding")
    end
    if edits.content_type ~= nil then
        ngx.header["Content-Type"] = C_string(edits.content_type, edits.content_type_len)
    end
    for i = 0, tonumber(edits.set_len) - 1 do
        local h = edits.set[i]
        ngx.header[C_string(h.name, h.name_len)] = C_string(h.value, h.value_len)
    end
    if edits.etag_op == EDIT_SET then
        ngx.header["ETag"] = C_string(edits.etag, edits.etag_len)
    elseif edits.etag_op == EDIT_REMOVE then
        ngx.header["ETag"] = nil
    end
    if edits.remove_accept_ranges ~= 0 then
        ngx.header["Accept-Ranges"] = nil
    end
end
_M.apply_edits = apply_edits


-- After an answer: log why a body that could have been transcoded went out as it came.
local function log_refusal(exchange)
    local why = ffi_new("rpcedge_error_t")
    if lib.rpcedge_exchange_transcode(exchange, why) == TRANSCODE_REFUSED then
        ngx.log(ngx.WARN, "rpcedge: not transcoded: ", C_string(why.message))
    end
end


local Exchange = {}
Exchange.__index = Exchange


-- The core's exchange for the current request, from its method, path and headers; `at_head`: its
-- head goes out before its body (the proxy_pass form).
local function new_exchange(settings, at_head)
    local exchange = ffi_gc(lib.rpcedge_exchange_new(settings), lib.rpcedge_exchange_free)
    if at_head then
        lib.rpcedge_exchange_headers_at_head(exchange)
    end
    local method = ngx.req.get_method()
    lib.rpcedge_exchange_request_method(exchange, method, #method)
    local path = ngx.var.uri
    lib.rpcedge_exchange_request_path(exchange, path, #path)
    local request_headers = ngx.req.get_headers(0, true)
    feed_headers(exchange, lib.rpcedge_exchange_request_header, request_headers)
    return setmetatable({ handle = exchange, settings = settings, request_headers = request_headers }, Exchange)
end
_M.new_exchange = new_exchange


-- Starts the core's exchange for the current request, from its method, path, headers and (when
-- the core wants it: with "transcode" or "transcode_upstream_ssz" in the settings, the request
-- body must have been read, ngx.req.read_body(), and be in memory) its body. Call it before the
-- subrequest: `upstream_accept` may then change what the node is asked for.
function _M.new(settings)
    local self = new_exchange(settings, false)
    if lib.rpcedge_exchange_wants_request_body(self.handle) ~= 0 then
        local request_body = ngx.req.get_body_data()
        if request_body then
            lib.rpcedge_exchange_request_body(self.handle, request_body, #request_body)
        end
    end
    return self
end


-- With "transcode_upstream_ssz": sets the request's Accept to ask the node for SSZ (and drops
-- Accept-Encoding, as an encoded answer could not be rendered) where the core says so, for the
-- subrequest that follows to inherit. Returns whether it did.
function Exchange:ask_upstream()
    local accept = lib.rpcedge_exchange_upstream_accept(self.handle)
    if accept.data == nil then
        return false
    end
    ngx.req.set_header("Accept", C_string(accept.data, accept.len))
    ngx.req.clear_header("Accept-Encoding")
    return true
end


-- The node answers identity wherever rpcedge may have work on its answer (the core says where,
-- knowing whether the cache may keep it): Accept-Encoding is dropped from the request the node
-- gets, whatever the location's proxy_set_header (an encoded answer passes as it came).
local function ask_identity(exchange, cache)
    if cache then
        lib.rpcedge_exchange_cache_may_keep(exchange.handle)
    end
    if lib.rpcedge_exchange_node_identity(exchange.handle) ~= 0 then
        ngx.req.clear_header("Accept-Encoding")
    end
end
_M.ask_identity = ask_identity


-- The subrequest methods, by the client's method.
local CAPTURE_METHODS = {
    GET = ngx.HTTP_GET, HEAD = ngx.HTTP_HEAD, POST = ngx.HTTP_POST, PUT = ngx.HTTP_PUT,
    DELETE = ngx.HTTP_DELETE, OPTIONS = ngx.HTTP_OPTIONS, PATCH = ngx.HTTP_PATCH,
}


-- Asks the node through the internal location `prefix` (proxy_pass to it) as the client asked
-- this server: its method, path and query, its headers (a subrequest inherits them, with the
-- Accept of ask_upstream) and its body (read with ngx.req.read_body() first). Returns the
-- subrequest's response for respond; a method a subrequest cannot make answers 405.
-- With a cache section in the settings, rpcedge-cached is asked first, for the request in
-- `namespace` (the network whose node `prefix` reaches; default: the section's "namespace";
-- neither: a BYPASS): a hit comes back as the response, a batch's calls the cache answered are
-- not sent to the node, and the answer is stored behind the response.
function Exchange:capture(prefix, namespace)
    local method = ngx.req.get_method()
    local capture_method = CAPTURE_METHODS[method]
    if capture_method == nil then
        return ngx.exit(ngx.HTTP_NOT_ALLOWED)
    end
    -- HEAD goes to the node as GET: nginx answers HEAD itself from a full answer's head
    local options = {
        method = capture_method == ngx.HTTP_HEAD and ngx.HTTP_GET or capture_method,
        args = ngx.var.args,
        always_forward_body = true,
    }
    local cache = daemon_cache(self.settings, namespace, self.request_headers)
    self.cache = cache
    if cache then
        if cache:lookup() then
            return cache:hit_response()
        end
        options.body = cache:node_request()
    end
    ask_identity(self, cache)
    local res = ngx.location.capture(prefix .. ngx.var.uri, options)
    if cache then
        cache:head(res.status, #res.body, res.header)
        if res.truncated then
            -- neither merged nor kept: respond fails it
            cache.holding, cache.replacing = false, false
        else
            res.body = cache:pass(res.body, true)
        end
    end
    return res
end


-- Answers the current request with a subrequest's response (`res` from ngx.location.capture):
-- its status and headers, and its body as the core decides: transcoded to SSZ for a client that
-- asks for it, or rendered as JSON from the SSZ the node was asked for, then compressed or not.
-- A cache hit from `capture` goes out as it is. Returns the mode ("oneshot", "small",
-- "untouched", "stream", "incompressible", "cached", or "failed" after answering with the
-- status the core gives, or closing the connection).
function Exchange:respond(res)
    local exchange, cache = self.handle, self.cache
    if res.cached then
        cache:send_hit(res)
        return "cached"
    end
    if res.truncated then
        -- the node's answer was cut short (a reset, a lying Content-Length): never sent as whole
        ngx.log(ngx.ERR, "rpcedge: the node's answer was cut short")
        local status = lib.rpcedge_exchange_abort(exchange)
        count(lib.rpcedge_count_exchange(exchange, 0, 0, counts))
        if cache then
            cache:ended()
        end
        -- 444: nginx closes the connection, the reset of the one failure policy
        ngx.exit(status ~= 0 and status or 444)
        return "failed"
    end

    local body = res.body or ""
    ngx.status = res.status
    for name, value in pairs(res.header) do
        if not HOP_BY_HOP[name:lower()] then
            ngx.header[name] = value
        end
    end
    if cache then
        cache:mark_status()
    end
    feed_headers(exchange, lib.rpcedge_exchange_response_header, res.header)
    -- the whole body is here: its length is known whatever the node's framing was
    lib.rpcedge_exchange_response_content_length(exchange, #body)

    local edits = ffi_new("rpcedge_header_edits_t")
    if lib.rpcedge_exchange_response_head(exchange, res.status, edits) == PLAN_PASS then
        apply_edits(edits, #body)
        ngx.print(body)
        return self:ended(0)
    end

    local out = ffi_new("rpcedge_output_t")
    local err = ffi_new("rpcedge_error_t")
    -- the worker's CPU time, fine enough for one feed (ngx.now() is in milliseconds)
    local started = os_clock()
    local failed = lib.rpcedge_exchange_feed(exchange, body, #body, FEED_END, ngx.now() * 1000, out, err) ~= 0
    local compress_us = (os_clock() - started) * 1e6
    if failed then
        ngx.log(ngx.ERR, "rpcedge: ", C_string(err.message))
        local status = lib.rpcedge_exchange_failure(exchange)
        self:ended(compress_us, true)
        -- 444: nginx closes the connection, the reset of the one failure policy
        ngx.exit(status ~= 0 and status or 444)
        return "failed"
    end
    -- with the headers held (buffered), they come with the output; streamed, they are in force
    apply_edits(bit_band(out.flags, OUT_HEADERS) ~= 0 and out.edits or edits, nil)
    ngx.print(C_string(out.data, out.len))
    -- a long witness's SSZ comes piece by piece
    while bit_band(out.flags, OUT_MORE) ~= 0 do
        if lib.rpcedge_exchange_feed(exchange, nil, 0, 0, ngx.now() * 1000, out, err) ~= 0 then
            ngx.log(ngx.ERR, "rpcedge: ", C_string(err.message))
            self:ended(compress_us, true)
            return ngx.exit(444)
        end
        ngx.print(C_string(out.data, out.len))
    end
    return self:ended(compress_us)
end


-- The answer is out: counted, a transcoding refusal logged, the cache's store sent behind it
-- (not when the answer `failed`), and the mode.
function Exchange:ended(compress_us, failed)
    count(lib.rpcedge_count_exchange(self.handle, 1, compress_us, counts))
    log_refusal(self.handle)
    if self.cache then
        self.cache.holding = self.cache.holding and not failed
        self.cache:ended()
    end
    local mode = lib.rpcedge_exchange_mode(self.handle)
    return C_string(mode.data, mode.len)
end


-- The exchange and the answer in one call, for a subrequest made without `ask_upstream`.
function _M.respond(settings, res)
    return _M.new(settings):respond(res)
end


return _M
