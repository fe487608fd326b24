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
local str_lower = string.lower

local lib = abi.lib
local count, counts = abi.count, abi.counts
local PLAN_PASS = abi.PLAN_PASS
local EDIT_REMOVE, EDIT_APPEND, VARY_IN_LINE = abi.EDIT_REMOVE, abi.EDIT_APPEND, abi.VARY_IN_LINE
local OUT_MORE = abi.OUT_MORE
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


-- Adds a value beside those of the response header `name`.
local function append(name, value)
    local values = ngx.header[name]
    if values == nil then
        ngx.header[name] = value
    elseif type(values) == "table" then
        values[#values + 1] = value
        ngx.header[name] = values
    else
        ngx.header[name] = { values, value }
    end
end


local ops_out = ffi_new("const rpcedge_header_op_t *[1]")

-- The core's edits of the answer's head (those it gave last) on ngx.header, one operation after
-- the other in its order (rpcedge_exchange_header_ops, as the Envoy adapters apply them);
-- `length`: the answer's Content-Length, unless they set or drop it.
local function apply_edits(exchange, length)
    ngx.header["Content-Length"] = length
    local ops = ops_out
    for i = 0, tonumber(lib.rpcedge_exchange_header_ops(exchange, VARY_IN_LINE, ops)) - 1 do
        local op = ops[0][i]
        local name = C_string(op.name.data, op.name.len)
        if op.op == EDIT_REMOVE then
            ngx.header[name] = nil
        elseif op.op == EDIT_APPEND then
            append(name, C_string(op.value.data, op.value.len))
        else
            ngx.header[name] = C_string(op.value.data, op.value.len)
        end
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
    self:set_node_header("Accept", C_string(accept.data, accept.len))
    self:set_node_header("Accept-Encoding", nil)
    return true
end


-- Sets a request header for the node's request alone: the client's value is kept for
-- put_back_client_headers.
function Exchange:set_node_header(name, value)
    local client = self.client_headers
    if client == nil then
        client = {}
        self.client_headers = client
    end
    if client[name] == nil then
        client[name] = false
        local lower = str_lower(name)
        -- the raw headers, as the client spelled their names (HTTP/2 lowercase)
        for sent, values in pairs(self.request_headers) do
            if str_lower(sent) == lower then
                client[name] = values
            end
        end
    end
    ngx.req.set_header(name, value)
end


-- The client's request headers back as it sent them, once the node's request is made: nginx's
-- gzip, a log's $http_accept_encoding and every later phase see the client's request, as they
-- would without rpcedge.
function Exchange:put_back_client_headers()
    local client = self.client_headers
    if client == nil then
        return
    end
    self.client_headers = nil
    for name, value in pairs(client) do
        ngx.req.set_header(name, value or nil)
    end
end


-- The node answers identity wherever rpcedge may have work on its answer (the core says where,
-- knowing whether the cache may keep it): Accept-Encoding is dropped from the request the node
-- gets, whatever the location's proxy_set_header (an encoded answer passes as it came).
local function ask_identity(exchange, cache)
    if cache and cache:may_keep() then
        lib.rpcedge_exchange_cache_may_keep(exchange.handle)
    end
    if lib.rpcedge_exchange_node_identity(exchange.handle) ~= 0 then
        exchange:set_node_header("Accept-Encoding", nil)
    end
end
_M.ask_identity = ask_identity


-- lua-nginx-module before 0.10.28 refuses ngx.location.capture in an HTTP/2 request.
local CAPTURES_HTTP2 = (ngx.config.ngx_lua_version or 0) >= 10028
local told_http2 = false


-- The request goes to the node through `prefix` as the client sent it, as it would without
-- rpcedge, where this nginx cannot make a subrequest of it: its answer is neither compressed nor
-- kept, and a key the lookup held is let go at once.
local function pass_untouched(exchange, prefix)
    if not told_http2 then
        told_http2 = true
        ngx.log(ngx.WARN, "rpcedge: lua-nginx-module ", ngx.config.ngx_lua_version, " makes no subrequest of an ",
                "HTTP/2 request (0.10.28 does): what the cache does not answer goes to the node untouched")
    end
    exchange:put_back_client_headers()
    if exchange.cache then
        exchange.cache:ended()
    end
    return ngx.exec(prefix .. ngx.var.uri, ngx.var.args)
end


-- The subrequest methods, by the client's method.
local CAPTURE_METHODS = {
    GET = ngx.HTTP_GET, HEAD = ngx.HTTP_HEAD, POST = ngx.HTTP_POST, PUT = ngx.HTTP_PUT,
    DELETE = ngx.HTTP_DELETE, OPTIONS = ngx.HTTP_OPTIONS, PATCH = ngx.HTTP_PATCH,
}


-- Asks the node through the internal location `prefix` (proxy_pass to it) as the client asked
-- this server: its method, path and query, its headers (a subrequest inherits them, with the
-- Accept of ask_upstream) and its body (read with ngx.req.read_body() first). Returns the
-- subrequest's response for respond; a method a subrequest cannot make answers 405. An HTTP/2
-- request that the cache does not answer goes to the node untouched where this nginx's Lua module
-- cannot capture it (pass_untouched).
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
        local hit, body = cache:lookup()
        if hit then
            return cache:hit_response()
        end
        options.body = body
    end
    if not CAPTURES_HTTP2 and ngx.req.http_version() == 2 then
        return pass_untouched(self, prefix)
    end
    ask_identity(self, cache)
    local res = ngx.location.capture(prefix .. ngx.var.uri, options)
    self:put_back_client_headers()
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

    if lib.rpcedge_exchange_response_head(exchange, res.status) == PLAN_PASS then
        apply_edits(exchange, #body)
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
    -- with the headers held (buffered), the output's are the last; streamed, the head's are
    apply_edits(exchange, nil)
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
