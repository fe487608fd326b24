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
-- "cache" section whose "clusters" are the daemons' addresses, one per shard ("unix:/path" or
-- "127.0.0.1:18090"; its other fields as Envoy's), and name each location's network:
--
--     local settings = rpcedge.settings('{"cache": {"clusters": ["127.0.0.1:18090"]}}')
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
--         local hit, gzip = c:hit(entry, 1024) -- the client's own id spliced in; gzip if it takes it
--         -- send hit with c:hit_headers() (Content-Type, Content-Encoding, Vary, the node's)
--     end
--     -- after the node answered (res from ngx.location.capture):
--     if c:response_head(res.status, #res.body, res.header) and not res.truncated then
--         local put = c:store(res.body)       -- nil: not kept (an error, a null, not final, ...)
--         -- put.entry under c:key(), for put.ttl seconds if set; put.requires_final: keep it
--         -- only once that block (a decimal number) or the block of that transaction (a hash)
--         -- is finalized in the namespace
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
-- The shared library is found by ffi.load: set RPCEDGE_LIB (env directive) to its path, or put
-- librpcedge.so where the dynamic linker looks.

local ffi = require "ffi"

local C_string = ffi.string
local ffi_gc = ffi.gc
local ffi_new = ffi.new
local bit_band = bit.band
local pairs = pairs
local ipairs = ipairs
local type = type
local math_max = math.max
local tostring = tostring
local tonumber = tonumber
local error = error
local os_clock = os.clock
local table_concat = table.concat
local format = string.format

ffi.cdef[[
typedef struct rpcedge_exchange_t rpcedge_exchange_t;
typedef struct rpcedge_settings_t rpcedge_settings_t;

typedef struct {
  const uint8_t *data;
  size_t len;
} rpcedge_str_t;

typedef struct {
  char field[32];
  char message[224];
} rpcedge_error_t;

typedef struct {
  const uint8_t *name;
  size_t name_len;
  const uint8_t *value;
  size_t value_len;
} rpcedge_header_t;

typedef struct {
  rpcedge_str_t content_encoding;
  uint8_t content_length_op;
  uint8_t etag_op;
  uint8_t add_vary;
  uint8_t remove_accept_ranges;
  uint8_t add_vary_accept;
  uint8_t remove_content_encoding;
  uint64_t content_length;
  const uint8_t *etag;
  size_t etag_len;
  const uint8_t *content_type;
  size_t content_type_len;
  const rpcedge_header_t *set;
  size_t set_len;
} rpcedge_header_edits_t;

typedef struct {
  const uint8_t *data;
  size_t len;
  uint32_t flags;
  rpcedge_header_edits_t edits;
} rpcedge_output_t;

rpcedge_settings_t *rpcedge_settings_from_json(const uint8_t *json, size_t len, rpcedge_error_t *err);
void rpcedge_settings_free(rpcedge_settings_t *settings);
rpcedge_exchange_t *rpcedge_exchange_new(const rpcedge_settings_t *settings);
void rpcedge_exchange_headers_at_head(rpcedge_exchange_t *exchange);
void rpcedge_exchange_free(rpcedge_exchange_t *exchange);
void rpcedge_exchange_request_method(rpcedge_exchange_t *exchange, const uint8_t *method, size_t len);
void rpcedge_exchange_request_path(rpcedge_exchange_t *exchange, const uint8_t *path, size_t len);
void rpcedge_exchange_request_header(rpcedge_exchange_t *exchange, const uint8_t *name, size_t name_len,
                                     const uint8_t *value, size_t value_len);
void rpcedge_exchange_response_header(rpcedge_exchange_t *exchange, const uint8_t *name, size_t name_len,
                                      const uint8_t *value, size_t value_len);
void rpcedge_exchange_response_content_length(rpcedge_exchange_t *exchange, int64_t length);
uint8_t rpcedge_exchange_wants_request_body(const rpcedge_exchange_t *exchange);
void rpcedge_exchange_request_body(rpcedge_exchange_t *exchange, const uint8_t *body, size_t len);
rpcedge_str_t rpcedge_exchange_upstream_accept(rpcedge_exchange_t *exchange);
void rpcedge_exchange_cache_may_keep(rpcedge_exchange_t *exchange);
int32_t rpcedge_exchange_node_identity(const rpcedge_exchange_t *exchange);
uint8_t rpcedge_exchange_response_head(rpcedge_exchange_t *exchange, uint16_t status,
                                       rpcedge_header_edits_t *edits);
int32_t rpcedge_exchange_feed(rpcedge_exchange_t *exchange, const uint8_t *data, size_t len, uint32_t flags,
                              uint64_t now_ms, rpcedge_output_t *out, rpcedge_error_t *error);
uint16_t rpcedge_exchange_failure(const rpcedge_exchange_t *exchange);
uint16_t rpcedge_exchange_abort(rpcedge_exchange_t *exchange);
rpcedge_str_t rpcedge_exchange_mode(const rpcedge_exchange_t *exchange);
uint8_t rpcedge_exchange_transcode(const rpcedge_exchange_t *exchange, rpcedge_error_t *why);

typedef struct rpcedge_cache_t rpcedge_cache_t;

typedef struct {
  uint32_t shard;
  rpcedge_str_t method;
  rpcedge_str_t path;
  const rpcedge_header_t *headers;
  size_t headers_len;
  rpcedge_str_t body;
  uint64_t timeout_ms;
} rpcedge_daemon_call_t;

typedef struct {
  rpcedge_str_t key;
  rpcedge_str_t entry;
  uint64_t ttl_s;
  rpcedge_str_t requires_final;
} rpcedge_kept_entry_t;

typedef struct {
  size_t shards;
  rpcedge_str_t ns;
  uint64_t hot_bytes;
  uint64_t min_length;
  uint8_t status_header;
  uint8_t status_reason;
} rpcedge_cache_host_t;

int32_t rpcedge_settings_cache(const rpcedge_settings_t *settings, rpcedge_cache_host_t *host);
int32_t rpcedge_settings_cache_cluster(const rpcedge_settings_t *settings, size_t index, rpcedge_str_t *name);
rpcedge_cache_t *rpcedge_cache_new(const rpcedge_settings_t *settings, rpcedge_str_t ns, rpcedge_str_t method,
                                   rpcedge_str_t path, const uint8_t *body, size_t body_len,
                                   const rpcedge_header_t *headers, size_t headers_len);
int32_t rpcedge_cache_takes_length(const rpcedge_settings_t *settings, uint64_t content_length);
void rpcedge_cache_free(rpcedge_cache_t *cache);
int32_t rpcedge_cache_next_lookup(rpcedge_cache_t *cache, rpcedge_daemon_call_t *call);
int32_t rpcedge_cache_node_request(rpcedge_cache_t *cache, rpcedge_str_t *body);
void rpcedge_cache_failed(rpcedge_cache_t *cache);
int32_t rpcedge_cache_keep_holding(rpcedge_cache_t *cache, uint64_t held);
int32_t rpcedge_cache_replaces_body(const rpcedge_cache_t *cache);
void rpcedge_cache_batch_answer(rpcedge_cache_t *cache, const uint8_t *body, size_t len, int32_t whole,
                                rpcedge_str_t *answer);
int32_t rpcedge_cache_next_store(rpcedge_cache_t *cache, rpcedge_daemon_call_t *call);
int32_t rpcedge_cache_release(rpcedge_cache_t *cache, rpcedge_daemon_call_t *call);
int32_t rpcedge_cache_answered(rpcedge_cache_t *cache, uint16_t status, const rpcedge_header_t *headers,
                               size_t headers_len, const uint8_t *body, size_t body_len, uint64_t min_length);
int32_t rpcedge_cache_hit(const rpcedge_cache_t *cache, uint16_t *status, rpcedge_str_t *body);
int32_t rpcedge_cache_hit_header(const rpcedge_cache_t *cache, size_t index, rpcedge_str_t *name,
                                 rpcedge_str_t *value);
int32_t rpcedge_cache_response_head(rpcedge_cache_t *cache, uint16_t status, int64_t content_length,
                                    const rpcedge_header_t *headers, size_t headers_len);
int32_t rpcedge_cache_store(rpcedge_cache_t *cache, const uint8_t *body, size_t len, rpcedge_daemon_call_t *call);
int32_t rpcedge_cache_key(rpcedge_cache_t *cache, rpcedge_str_t *key);
int32_t rpcedge_cache_found(rpcedge_cache_t *cache, const uint8_t *entry, size_t len, uint64_t min_length);
int32_t rpcedge_cache_keep(rpcedge_cache_t *cache, const uint8_t *body, size_t len, rpcedge_kept_entry_t *kept);
rpcedge_str_t rpcedge_cache_status(const rpcedge_cache_t *cache, uint32_t reasons);

typedef struct {
  uint32_t index;
  uint64_t amount;
} rpcedge_count_t;

size_t rpcedge_counters(void);
const char *rpcedge_counter_name(size_t index);
size_t rpcedge_count_exchange(const rpcedge_exchange_t *exchange, uint8_t ended, uint64_t compress_us,
                              rpcedge_count_t *counts);
size_t rpcedge_count_cache(const rpcedge_cache_t *cache, rpcedge_count_t *counts);
size_t rpcedge_count_refusal(rpcedge_cache_t *cache, rpcedge_count_t *counts);
size_t rpcedge_count_store(uint16_t status, rpcedge_count_t *counts);
]]

local lib = ffi.load(os.getenv("RPCEDGE_LIB") or "rpcedge")

-- rpcedge.h's constants
local PLAN_PASS = 0
local EDIT_SET, EDIT_REMOVE = 1, 2
local OUT_HEADERS = 1
local OUT_MORE = 16
local FEED_END = 1
local FEED_FLUSH = 2
local TRANSCODE_REFUSED = 2
local COUNTS_MAX = 5
local CACHE_MAX_ANSWER = 67117110
-- how long a connection to a daemon stays pooled: less than the daemon keeps one idle (10 s, its
-- header_read_timeout), so that a pooled one is never one it is closing
local DAEMON_IDLE_MS = 8000

-- not copied from the node's answer: the framing is this response's own
local HOP_BY_HOP = {
    ["content-length"] = true, ["transfer-encoding"] = true, ["connection"] = true,
    ["keep-alive"] = true, ["trailer"] = true, ["upgrade"] = true,
}

local _M = { version = "0.5.0" }


-- The counters: their names once, and the dict that holds their numbers by index.
local counter_names = {}
local ncounters = tonumber(lib.rpcedge_counters())
for i = 0, ncounters - 1 do
    counter_names[i] = C_string(lib.rpcedge_counter_name(i))
end
local counters_dict = "rpcedge_counters"
local counts = ffi_new("rpcedge_count_t[?]", COUNTS_MAX)


-- Names the lua_shared_dict that keeps the counters (default "rpcedge_counters").
function _M.count_in(name)
    counters_dict = name
end


-- Adds the `n` counts the core just put in `counts`.
local function count(n)
    local dict = ngx.shared[counters_dict]
    if dict == nil then
        return
    end
    for i = 0, tonumber(n) - 1 do
        dict:incr(counts[i].index, tonumber(counts[i].amount), 0)
    end
end


-- Prints every counter in Prometheus' text format, as nginx's rpcedge_status and Envoy do.
function _M.status()
    local dict = ngx.shared[counters_dict]
    local lines = {}
    for i = 0, ncounters - 1 do
        local name = counter_names[i]
        local value = dict and dict:get(i) or 0
        lines[#lines + 1] = format("# TYPE %s counter\n%s{} %.0f\n", name, name, value)
    end
    ngx.header["Content-Type"] = "text/plain; version=0.0.4"
    ngx.print(table_concat(lines))
end


local function rstr(value)
    local s = ffi_new("rpcedge_str_t")
    if value ~= nil then
        s.data, s.len = value, #value
    end
    return s
end


local function lua_string(s)
    return s.data ~= nil and C_string(s.data, s.len) or nil
end


-- The daemons of settings whose cache section is enabled, by the settings: where each shard's
-- daemon listens and what this binding applies itself.
local daemons_of = setmetatable({}, { __mode = "k" })


-- A daemon's address as the cache section's "clusters" name it: "unix:/path" or an IP address
-- and port ("127.0.0.1:18090", "[::1]:18090"); nil when it is neither.
local function daemon_address(name)
    if name:find("^unix:/") then
        return { name }
    end
    -- an address: a name would need nginx's resolver for every connection
    local host, port = name:match("^(%[[%x:.]+%]):(%d+)$")
    if not host then
        host, port = name:match("^(%d+%.%d+%.%d+%.%d+):(%d+)$")
    end
    port = tonumber(port)
    if not port or port < 1 or port > 65535 then
        return nil
    end
    return { host, port }
end


-- The daemon form's configuration from validated settings, or nil without a cache section.
local function daemon_config(settings)
    local host = ffi_new("rpcedge_cache_host_t")
    if lib.rpcedge_settings_cache(settings, host) == 0 then
        return nil
    end
    if host.hot_bytes ~= 0 then
        error("rpcedge: cache_hot_bytes: the Lua binding keeps no hot tier (nginx's module does)", 3)
    end
    local config = {
        ns = lua_string(host.ns),
        min_length = tonumber(host.min_length),
        status_header = host.status_header ~= 0,
        status_reason = host.status_reason ~= 0,
    }
    local name = ffi_new("rpcedge_str_t")
    for shard = 0, tonumber(host.shards) - 1 do
        lib.rpcedge_settings_cache_cluster(settings, shard, name)
        local address = daemon_address(lua_string(name))
        if not address then
            error("rpcedge: cache_shards: " .. lua_string(name) .. " is not a daemon's address "
                  .. "(unix:/path, or an IP address and port; \"enabled\": false for rpcedge.cache "
                  .. "without the daemon)", 3)
        end
        config[shard] = address
    end
    return config
end


-- Validated settings from the JSON the Envoy filter takes ("" for the defaults); raises an error
-- naming the field that is out of range. With a "cache" section, its "clusters" are the daemons'
-- addresses, one per shard.
function _M.settings(json)
    json = json or ""
    local err = ffi_new("rpcedge_error_t")
    local settings = lib.rpcedge_settings_from_json(json, #json, err)
    if settings == nil then
        error("rpcedge: " .. C_string(err.field) .. ": " .. C_string(err.message), 2)
    end
    settings = ffi_gc(settings, lib.rpcedge_settings_free)
    daemons_of[settings] = daemon_config(settings)
    return settings
end


-- A call the core made for a daemon (rpcedge_daemon_call_t), copied: { shard, method, path,
-- headers (a list of { name, value }), body (or nil), timeout_ms }.
local function daemon_call_of(call)
    local headers = {}
    for i = 0, tonumber(call.headers_len) - 1 do
        local header = call.headers[i]
        headers[i + 1] = { C_string(header.name, header.name_len), C_string(header.value, header.value_len) }
    end
    return {
        shard = call.shard,
        method = lua_string(call.method),
        path = lua_string(call.path),
        headers = headers,
        body = lua_string(call.body),
        timeout_ms = tonumber(call.timeout_ms),
    }
end


-- Makes a call of the core's (daemon_call_of) to a daemon over a cosocket, within its timeout in
-- all: the answer's status, headers (lower case names) and body, or nil and why. Debian packages
-- no lua-resty-http, and the daemon's answers are always framed by their Content-Length.
local function daemon_call(daemon, call)
    local body = call.body
    local deadline = ngx.now() * 1000 + call.timeout_ms
    local sock = ngx.socket.tcp()
    local function within()
        ngx.update_time()
        sock:settimeout(math_max(deadline - ngx.now() * 1000, 1))
    end
    within()
    local ok, err
    if daemon[2] then
        ok, err = sock:connect(daemon[1], daemon[2])
    else
        ok, err = sock:connect(daemon[1])
    end
    if not ok then
        return nil, err
    end
    local request = { call.method, " ", call.path, " HTTP/1.1\r\nHost: rpcedge-cached\r\n" }
    for _, header in ipairs(call.headers) do
        request[#request + 1] = header[1] .. ": " .. header[2] .. "\r\n"
    end
    if body then
        request[#request + 1] = "Content-Length: " .. #body .. "\r\n"
    end
    request[#request + 1] = "\r\n"
    request[#request + 1] = body
    within()
    ok, err = sock:send(request)
    local line, status
    if ok then
        within()
        line, err = sock:receive("*l")
        status = line and tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
    end
    if not status then
        sock:close()
        return nil, err or "not an HTTP answer"
    end
    local found, length, reuse, chunked = {}, 0, true, false
    while true do
        within()
        line, err = sock:receive("*l")
        if not line then
            sock:close()
            return nil, err
        end
        if line == "" then
            break
        end
        local name, value = line:match("^([^:]+):%s*(.-)%s*$")
        name = name and name:lower()
        if name == "content-length" then
            length = tonumber(value)
        elseif name == "transfer-encoding" then
            chunked = true
        elseif name == "connection" then
            reuse = value:lower() ~= "close"
        elseif name then
            found[name] = value
        end
    end
    if chunked or length == nil or length > CACHE_MAX_ANSWER then
        sock:close()
        return nil, "an answer not framed by a Content-Length the cache takes"
    end
    local answer = ""
    if length > 0 then
        within()
        answer, err = sock:receive(length)
        if not answer then
            sock:close()
            return nil, err
        end
    end
    if reuse then
        sock:setkeepalive(DAEMON_IDLE_MS, 64)
    else
        sock:close()
    end
    return status, found, answer
end


-- What goes to the daemons behind the answers (the filters cannot use cosockets): each worker's
-- jobs (a request's stores, then the release of a key it held without one), in order, drained by
-- at most DRAINERS timers however many answers end at once (OpenResty drops a timer past
-- lua_max_running_timers). Past QUEUE_BYTES of entries waiting, a job's stores are dropped and
-- counted as failed, as a store the daemon never answered.
local DRAINERS, QUEUE_BYTES = 4, 64 * 1024 * 1024
local queue, queue_head, queue_tail, queued_bytes = {}, 1, 0, 0
-- the drainers running, and the timers made for more that have not started: one that OpenResty
-- could not run never starts, so those of a while ago are counted out
local running, starting, started_at = 0, 0, 0
local START_WITHIN_S = 1


local function fail_stores(job)
    for _ = 1, #job.stores do
        count(lib.rpcedge_count_store(0, counts))
    end
    queued_bytes = queued_bytes - job.bytes
    job.stores, job.bytes = {}, 0
end


local function run_job(job, premature)
    local daemons = job.daemons
    for _, put in ipairs(job.stores) do
        local status, why = 0, "nginx is exiting"
        if not premature then
            status, why = daemon_call(daemons[put.shard], put)
        end
        if status ~= 204 then
            ngx.log(ngx.INFO, "rpcedge cache: store not taken (", status or why, ")")
        end
        count(lib.rpcedge_count_store(tonumber(status) or 0, counts))
    end
    -- (a worker that exits leaves the key to the daemon's lock time)
    if job.release and not premature then
        daemon_call(daemons[job.release.shard], job.release)
    end
end


local function drain(premature)
    starting, running = math_max(starting - 1, 0), running + 1
    while queue_head <= queue_tail do
        local job = queue[queue_head]
        queue[queue_head], queue_head = nil, queue_head + 1
        queued_bytes = queued_bytes - job.bytes
        run_job(job, premature)
    end
    running = running - 1
end


-- Queues a job: { daemons, stores, release (or nil), bytes (of the stores) }, the calls as
-- daemon_call_of gives them.
local function send_behind(job)
    queued_bytes = queued_bytes + job.bytes
    if queued_bytes > QUEUE_BYTES then
        ngx.log(ngx.WARN, "rpcedge cache: more than ", QUEUE_BYTES, " bytes wait for the daemon: stores dropped")
        fail_stores(job)
    end
    queue_tail = queue_tail + 1
    queue[queue_tail] = job
    local now = ngx.now()
    if starting > 0 and now - started_at > START_WITHIN_S then
        starting = 0
    end
    if running + starting < DRAINERS then
        local ok, err = ngx.timer.at(0, drain)
        if ok then
            starting, started_at = starting + 1, now
        elseif running + starting == 0 then
            -- nothing would drain the queue: what waits is dropped
            ngx.log(ngx.ERR, "rpcedge cache: no timer for the daemon's calls: ", err)
            while queue_head <= queue_tail do
                fail_stores(queue[queue_head])
                queue[queue_head], queue_head = nil, queue_head + 1
            end
        end
    end
end


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


-- The finalizer of a daemon-form cache handle: keeps the key it still holds for the next lookup.
local function release_when_collected(daemons)
    return function(handle)
        local release = held_key(handle)
        if release and #orphans < ORPHANS_MAX then
            orphans[#orphans + 1] = { daemons = daemons, stores = {}, bytes = 0, release = release }
        end
        lib.rpcedge_cache_free(handle)
    end
end


local Cache = {}
Cache.__index = Cache

-- Keeps Lua strings that an FFI array points to reachable while the core reads them: a local
-- that is not read again may be collected before the call.
local anchor = {}


-- A table of headers (name -> value, or a list of values for a repeated one) as the core's
-- array, and its length; the array points into the table's strings, which the caller keeps.
local function header_array(headers)
    local pairs_ = {}
    for name, value in pairs(headers) do
        if type(value) == "table" then
            for _, one in ipairs(value) do
                pairs_[#pairs_ + 1] = { name, tostring(one) }
            end
        else
            pairs_[#pairs_ + 1] = { name, tostring(value) }
        end
    end
    local array = ffi_new("rpcedge_header_t[?]", math_max(#pairs_, 1))
    for i, pair in ipairs(pairs_) do
        local header = array[i - 1]
        header.name, header.name_len = pair[1], #pair[1]
        header.value, header.value_len = pair[2], #pair[2]
    end
    return array, #pairs_, pairs_
end


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
function _M.cache(settings, body, namespace)
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
-- it is gzip, or nil when the node must answer (no entry, or a bad one).
function Cache:hit(entry, min_length)
    if lib.rpcedge_cache_found(self.handle, entry, entry and #entry or 0, min_length or 1024) == 0 then
        return nil
    end
    count(lib.rpcedge_count_cache(self.handle, counts))
    local body = ffi_new("rpcedge_str_t")
    local gzip = lib.rpcedge_cache_hit(self.handle, nil, body) == 1
    return lua_string(body), gzip
end


-- The hit's headers, as a list of { name, value }: Content-Type, Content-Encoding when gzip,
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
-- `ttl` (seconds) and `requires_final` (a block number, or a transaction hash whose block must be
-- final) are nil when they do not apply. The
-- entry's result is deflated here, once (rpcedge-cached does it when it is the storage), so
-- that every gzip hit is a splice.
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
    }
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
    local file = io.open(path, "rb")
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
    local daemons = daemons_of[settings]
    if daemons == nil then
        return nil
    end
    while #orphans > 0 do
        send_behind(table.remove(orphans))
    end
    local body
    if ngx.req.get_method() == "POST" then
        local length = tonumber(ngx.var.content_length)
        if length == nil or lib.rpcedge_cache_takes_length(settings, length) ~= 0 then
            ngx.req.read_body()
            body = request_body(settings)
        end
    end
    local cache = new_cache(settings, body, namespace or daemons.ns, request_headers, release_when_collected(daemons))
    cache.daemons = daemons
    -- the log phase ends what the answer did not (its client went away)
    ngx.ctx.rpcedge_cache, cache.request_key = cache, request_key()
    in_flight[cache.request_key] = cache
    return cache
end


-- Asks the daemons what the core asks, one lookup after the other: true on a hit. A lookup
-- that fails (no daemon, no answer in time) fails open: the node answers.
function Cache:lookup()
    local lookup = ffi_new("rpcedge_daemon_call_t")
    while lib.rpcedge_cache_next_lookup(self.handle, lookup) ~= 0 do
        local call = daemon_call_of(lookup)
        local status, found, answer = daemon_call(self.daemons[call.shard], call)
        if not status then
            ngx.log(ngx.INFO, "rpcedge cache: lookup failed: ", found)
            lib.rpcedge_cache_failed(self.handle)
            return false
        end
        local headers, n, strings = header_array(found)
        anchor[1] = strings
        local hit = lib.rpcedge_cache_answered(self.handle, status, headers, n, answer, #answer,
                                               self.daemons.min_length) ~= 0
        anchor[1] = nil
        if hit then
            return true
        end
    end
    return false
end


-- The body the node gets in place of the client's (a batch less the calls the cache answered),
-- or nil.
function Cache:node_request()
    local body = ffi_new("rpcedge_str_t")
    if lib.rpcedge_cache_node_request(self.handle, body) == 0 then
        return nil
    end
    return lua_string(body)
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
    if self.daemons.status_header then
        ngx.header["X-Rpcedge-Cache"] = self:status(self.daemons.status_reason)
    end
end


-- The node's head: whether its body is held (for the store, or to merge a batch's answers).
function Cache:head(status, content_length, headers)
    self.holding = self:response_head(status, content_length, headers)
    self.replacing = lib.rpcedge_cache_replaces_body(self.handle) ~= 0
    self.held, self.held_len = {}, 0
end


-- A piece of the node's body (`eof`: its last): what goes on in its place. The plain body is
-- held for the store while the core wants it; a split batch's answer is held until it ends (or
-- is too long to hold), and the client gets it merged with the cache's in its own order.
function Cache:pass(chunk, eof)
    if not (self.holding or self.replacing) then
        return chunk
    end
    self.held[#self.held + 1] = chunk
    self.held_len = self.held_len + #chunk
    local keep = lib.rpcedge_cache_keep_holding(self.handle, self.held_len) ~= 0
    if self.replacing then
        if keep and not eof then
            return ""
        end
        local held = table_concat(self.held)
        local answer = ffi_new("rpcedge_str_t")
        lib.rpcedge_cache_batch_answer(self.handle, held, #held, eof and 1 or 0, answer)
        -- past what is held, the rest passes on and nothing is stored
        self.replacing, self.holding, self.held = false, eof, { held }
        return lua_string(answer) or ""
    end
    if not keep then
        self.holding, self.held = false, nil
    end
    return chunk
end


-- The answer has gone out (or the request is over without one): its stores, and the release of
-- a key held without one, go to the daemons from a timer; why an answer was not kept is counted.
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
        local body = table_concat(self.held)
        local call = ffi_new("rpcedge_daemon_call_t")
        local more = lib.rpcedge_cache_store(self.handle, body, #body, call) ~= 0
        while more do
            stores[#stores + 1] = daemon_call_of(call)
            more = lib.rpcedge_cache_next_store(self.handle, call) ~= 0
        end
    end
    self.holding, self.held = false, nil
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
        send_behind({ daemons = self.daemons, stores = stores, release = release, bytes = bytes })
    end
end


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


-- Starts the core's exchange for the current request, from its method, path, headers and (when
-- the core wants it: with "transcode" or "transcode_upstream_ssz" in the settings, the request
-- body must have been read, ngx.req.read_body(), and be in memory) its body. Call it before the
-- subrequest: `upstream_accept` may then change what the node is asked for.
function _M.exchange(settings)
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
    return _M.exchange(settings):respond(res)
end


-- The proxy_pass form, from access_by_lua: starts the exchange of the request, for the filters.
-- With a cache section in the settings, rpcedge-cached is asked first, as `capture` does: a hit
-- is the answer (the node is not asked), and a batch's calls the cache answered are taken out
-- of the body the node gets.
function _M.access(settings, namespace)
    local state = { exchange = new_exchange(settings, true) }
    local cache = daemon_cache(settings, namespace, state.exchange.request_headers)
    if cache then
        if cache:lookup() then
            cache:send_hit(cache:hit_response())
            return ngx.exit(ngx.HTTP_OK)
        end
        local body = cache:node_request()
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
    local edits = ffi_new("rpcedge_header_edits_t")
    local plan = lib.rpcedge_exchange_response_head(self.handle, ngx.status, edits)
    apply_edits(edits, ngx.header["Content-Length"])
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
    local cache = ngx.ctx.rpcedge_cache or in_flight[request_key()]
    if cache then
        cache.holding = false
        cache:ended()
    end
end


return _M
