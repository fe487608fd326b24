-- resty.rpcedge.filter: the proxy_pass form, phase by phase: access (the exchange started, the
-- cache asked), header_filter (the head's edits), body_filter (each chunk as the core makes it)
-- and log (what a request that ended early leaves: an aborted exchange, a held key).

local ffi = require "ffi"
local abi = require "resty.rpcedge.abi"
local cache_module = require "resty.rpcedge.cache"
local exchange_module = require "resty.rpcedge.exchange"

local C_string = ffi.string
local ffi_new = ffi.new
local tonumber = tonumber
local os_clock = os.clock

local lib = abi.lib
local count, counts = abi.count, abi.counts
local PLAN_PASS = abi.PLAN_PASS
local FEED_END, FEED_FLUSH = abi.FEED_END, abi.FEED_FLUSH
local daemon_cache, of_request = cache_module.daemon_cache, cache_module.of_request
local new_exchange, ask_identity = exchange_module.new_exchange, exchange_module.ask_identity
local feed_headers, apply_edits = exchange_module.feed_headers, exchange_module.apply_edits

local _M = {}


-- The proxy_pass form, from access_by_lua: starts the exchange of the request, for the filters.
-- With a cache section in the settings, rpcedge-cached is asked first, as `capture` does: a hit
-- is the answer (the node is not asked), and a batch's calls the cache answered are taken out
-- of the body the node gets.
function _M.access(settings, namespace)
    local state = { exchange = new_exchange(settings, true) }
    local cache = daemon_cache(settings, namespace, state.exchange.request_headers)
    if cache then
        local hit, body = cache:lookup()
        if hit then
            cache:send_hit(cache:hit_response())
            return ngx.exit(ngx.HTTP_OK)
        end
        if body then
            ngx.req.set_body_data(body)
        end
        state.cache = cache
    end
    ask_identity(state.exchange, cache)
    ngx.ctx.rpcedge = state
end


-- From header_filter_by_lua: the node's head, with the core's edits (Content-Encoding, the
-- length dropped for a stream, Vary, ETag).
function _M.header_filter()
    local state = ngx.ctx.rpcedge
    if state == nil then
        return
    end
    state.exchange:put_back_client_headers()
    local cache = state.cache
    if cache then
        -- the node's own headers: nginx's add_header and the like come after this filter
        cache:head(ngx.status, tonumber(ngx.header["Content-Length"]), ngx.resp.get_headers(0, true))
        if cache.replacing then
            -- the merged answer's length is known once it is merged: after the head
            ngx.header["Content-Length"] = nil
        end
        cache:mark_status()
    end
    local self = state.exchange
    -- (read again: the exchange takes the head as the cache left it, without the node's length
    -- where a batch's answer is merged)
    feed_headers(self.handle, lib.rpcedge_exchange_response_header, ngx.resp.get_headers(0, true))
    local plan = lib.rpcedge_exchange_response_head(self.handle, ngx.status)
    apply_edits(self.handle, ngx.header["Content-Length"])
    if plan == PLAN_PASS then
        state.exchange = nil
        self:ended(0)
        return
    end
    self.out, self.err, self.compress_us = ffi_new("rpcedge_output_t"), ffi_new("rpcedge_error_t"), 0
end


-- From body_filter_by_lua: each chunk of the node's body as the core makes it, flushed (the
-- filter cannot see the node's own flushes, nor be woken by a timer to send what it holds).
function _M.body_filter()
    local state = ngx.ctx.rpcedge
    if state == nil then
        return
    end
    local chunk, eof = ngx.arg[1] or "", ngx.arg[2]
    local cache, self = state.cache, state.exchange
    if cache then
        chunk = cache:pass(chunk, eof)
    end
    if self and (chunk ~= "" or eof) then
        local started = os_clock()
        local failed = lib.rpcedge_exchange_feed(self.handle, chunk, #chunk, eof and FEED_END or FEED_FLUSH,
                                                 ngx.now() * 1000, self.out, self.err) ~= 0
        self.compress_us = self.compress_us + (os_clock() - started) * 1e6
        if failed then
            ngx.log(ngx.ERR, "rpcedge: ", C_string(self.err.message))
            ngx.ctx.rpcedge = nil
            self:ended(self.compress_us)
            -- the head is out: the response ends here, unfinished, never looking whole (and is
            -- not stored: the log phase releases a key it held)
            return ngx.ERROR
        end
        chunk = C_string(self.out.data, self.out.len)
    end
    ngx.arg[1] = chunk
    if eof then
        ngx.ctx.rpcedge = nil
        if self then
            self:ended(self.compress_us)
        end
        if cache then
            cache:ended()
        end
    end
end


-- From log_by_lua: a request that ended before its answer did (its client went away, the node's
-- answer was cut, an error_page or ngx.exec sent it elsewhere) counts the proxy_pass form's
-- exchange as aborted, as the other hosts do, and with the cache's daemon form releases the key
-- it held, so that the requests waiting for its answer go to the node at once rather than at the
-- lock's time.
function _M.log()
    local state = ngx.ctx.rpcedge
    if state and state.exchange then
        -- the proxy_pass form's exchange, whose body never reached its end: aborted
        ngx.ctx.rpcedge = nil
        count(lib.rpcedge_count_exchange(state.exchange.handle, 0, state.exchange.compress_us or 0, counts))
    end
    local cache = of_request()
    if cache then
        cache.holding = false
        cache:ended()
    end
end


return _M
