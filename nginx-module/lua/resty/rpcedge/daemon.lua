-- resty.rpcedge.daemon: the daemon of the response cache (rpcedge-cached) that settings name,
-- and how this worker talks to it: validated settings with their daemon's address, a call of the
-- core's made over a cosocket, and the queue of stores and releases that timers send behind the
-- answers.

local ffi = require "ffi"
local abi = require "resty.rpcedge.abi"

local C_string = ffi.string
local ffi_gc = ffi.gc
local ffi_new = ffi.new
local ipairs = ipairs
local math_max = math.max
local tonumber = tonumber
local error = error
local setmetatable = setmetatable

local lib = abi.lib
local count, counts = abi.count, abi.counts
local lua_string = abi.lua_string
local CACHE_MAX_ANSWER = abi.CACHE_MAX_ANSWER

-- how long a connection to a daemon stays pooled: less than the daemon keeps one idle (10 s, its
-- header_read_timeout), so that a pooled one is never one it is closing
local DAEMON_IDLE_MS = 8000

local _M = {}


-- The daemon form's configuration of settings whose cache section is enabled, by the settings:
-- where the daemon listens and what this binding applies itself.
local configs_of = setmetatable({}, { __mode = "k" })


-- A daemon's address as the cache section's "cluster" names it: "unix:/path" or an IP address
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
    local cluster = lua_string(host.cluster)
    local address = daemon_address(cluster)
    if not address then
        error("rpcedge: cache_cluster: " .. cluster .. " is not a daemon's address "
              .. "(unix:/path, or an IP address and port; \"enabled\": false for rpcedge.cache "
              .. "without the daemon)", 3)
    end
    return {
        address = address,
        ns = lua_string(host.ns),
        min_length = tonumber(host.min_length),
        status_header = host.status_header ~= 0,
        status_reason = host.status_reason ~= 0,
    }
end


-- Validated settings from the JSON the Envoy filter takes ("" for the defaults); raises an error
-- naming the field that is out of range. With a "cache" section, its "cluster" is the daemon's
-- address.
function _M.settings(json)
    json = json or ""
    local err = ffi_new("rpcedge_error_t")
    local settings = lib.rpcedge_settings_from_json(json, #json, err)
    if settings == nil then
        error("rpcedge: " .. C_string(err.field) .. ": " .. C_string(err.message), 2)
    end
    settings = ffi_gc(settings, lib.rpcedge_settings_free)
    configs_of[settings] = daemon_config(settings)
    return settings
end


-- The daemon form's configuration of settings (daemon_config), or nil when they have no cache
-- section (or one that is not enabled).
function _M.of(settings)
    return configs_of[settings]
end


-- A call the core made for the daemon (rpcedge_daemon_call_t), copied: { method, path, headers
-- (a list of { name, value }), body (or nil), timeout_ms }.
local function daemon_call_of(call)
    local headers = {}
    for i = 0, tonumber(call.headers_len) - 1 do
        local header = call.headers[i]
        headers[i + 1] = { C_string(header.name, header.name_len), C_string(header.value, header.value_len) }
    end
    return {
        method = lua_string(call.method),
        path = lua_string(call.path),
        headers = headers,
        body = lua_string(call.body),
        timeout_ms = tonumber(call.timeout_ms),
    }
end
_M.daemon_call_of = daemon_call_of


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
_M.daemon_call = daemon_call


-- What goes to the daemon behind the answers (the filters cannot use cosockets): each worker's
-- jobs (a request's stores, then the release of a key it held without one), in order, drained by
-- at most DRAINERS timers however many answers end at once (OpenResty drops a timer past
-- lua_max_running_timers, 256 by default). Each drainer waits on one call at a time, and a store
-- can take the daemon a node's round trip (a transaction's block, asked of the node), while the
-- misses that wait for the key wait for that store: 4 drainers held the load test's misses to
-- about 320/s, 32 let them run at about 710/s. Past QUEUE_BYTES of entries waiting, a job's stores
-- are dropped and counted as failed, as a store the daemon never answered.
local DRAINERS, QUEUE_BYTES = 32, 64 * 1024 * 1024
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
    for _, put in ipairs(job.stores) do
        local status, why = 0, "nginx is exiting"
        if not premature then
            status, why = daemon_call(job.daemon, put)
        end
        if status ~= 204 then
            ngx.log(ngx.INFO, "rpcedge cache: store not taken (", status or why, ")")
        end
        count(lib.rpcedge_count_store(tonumber(status) or 0, counts))
    end
    -- (a worker that exits leaves the key to the daemon's lock time)
    if job.release and not premature then
        daemon_call(job.daemon, job.release)
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


-- Queues a job: { daemon (its address), stores, release (or nil), bytes (of the stores) }, the
-- calls as daemon_call_of gives them.
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
_M.send_behind = send_behind


return _M
