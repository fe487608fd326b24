-- resty.rpcedge.abi: the core's C ABI (rpcedge.h) through LuaJIT's FFI: its declarations, the
-- shared library, its constants, the strings and header arrays the calls take, and the counters
-- every rpcedge host keeps (their names, the lua_shared_dict that holds them, the status page).
-- (shared-core/ffi/tests/c_header.rs reads the declarations and the constants from this file.)
--
-- The shared library is found by ffi.load: set RPCEDGE_LIB (env directive) to its path, or put
-- librpcedge.so where the dynamic linker looks.

local ffi = require "ffi"

local C_string = ffi.string
local ffi_new = ffi.new
local pairs = pairs
local ipairs = ipairs
local type = type
local math_max = math.max
local tostring = tostring
local tonumber = tonumber
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
  uint8_t op;
  rpcedge_str_t name;
  rpcedge_str_t value;
} rpcedge_header_op_t;

typedef struct {
  const uint8_t *data;
  size_t len;
  uint32_t flags;
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
uint8_t rpcedge_exchange_response_head(rpcedge_exchange_t *exchange, uint16_t status);
size_t rpcedge_exchange_header_ops(rpcedge_exchange_t *exchange, uint8_t vary, const rpcedge_header_op_t **ops);
int32_t rpcedge_exchange_feed(rpcedge_exchange_t *exchange, const uint8_t *data, size_t len, uint32_t flags,
                              uint64_t now_ms, rpcedge_output_t *out, rpcedge_error_t *error);
uint16_t rpcedge_exchange_failure(const rpcedge_exchange_t *exchange);
uint16_t rpcedge_exchange_abort(rpcedge_exchange_t *exchange);
rpcedge_str_t rpcedge_exchange_mode(const rpcedge_exchange_t *exchange);
uint8_t rpcedge_exchange_transcode(const rpcedge_exchange_t *exchange, rpcedge_error_t *why);

typedef struct rpcedge_cache_t rpcedge_cache_t;

typedef struct {
  rpcedge_str_t method;
  rpcedge_str_t path;
  const rpcedge_header_t *headers;
  size_t headers_len;
  rpcedge_str_t body;
  uint64_t timeout_ms;
} rpcedge_daemon_call_t;

typedef struct {
  uint8_t *region;
  size_t len;
  void (*lock)(void *data);
  void (*unlock)(void *data);
  void *data;
} rpcedge_hot_tier_t;

typedef struct {
  rpcedge_daemon_call_t call;
  rpcedge_str_t node_body;
} rpcedge_cache_next_t;

typedef struct {
  rpcedge_str_t key;
  rpcedge_str_t entry;
  uint64_t ttl_s;
  rpcedge_str_t requires_final;
  rpcedge_str_t block_hash;
} rpcedge_kept_entry_t;

typedef struct {
  rpcedge_str_t cluster;
  rpcedge_str_t ns;
  uint64_t hot_bytes;
  uint64_t min_length;
  uint8_t status_header;
  uint8_t status_reason;
} rpcedge_cache_host_t;

int32_t rpcedge_settings_cache(const rpcedge_settings_t *settings, rpcedge_cache_host_t *host);
rpcedge_cache_t *rpcedge_cache_new(const rpcedge_settings_t *settings, rpcedge_str_t ns, rpcedge_str_t method,
                                   rpcedge_str_t path, const uint8_t *body, size_t body_len,
                                   const rpcedge_header_t *headers, size_t headers_len);
int32_t rpcedge_cache_takes_length(const rpcedge_settings_t *settings, uint64_t content_length);
void rpcedge_cache_free(rpcedge_cache_t *cache);
int32_t rpcedge_cache_look_up(rpcedge_cache_t *cache, const rpcedge_hot_tier_t *hot, uint64_t now_s,
                              uint64_t min_length, rpcedge_cache_next_t *next);
int32_t rpcedge_cache_looked_up(rpcedge_cache_t *cache, uint16_t status, const rpcedge_header_t *headers,
                                size_t headers_len, const uint8_t *body, size_t body_len,
                                const rpcedge_hot_tier_t *hot, uint64_t now_s, uint64_t min_length,
                                rpcedge_cache_next_t *next);
int32_t rpcedge_cache_replaces_body(const rpcedge_cache_t *cache);
int32_t rpcedge_cache_pass(rpcedge_cache_t *cache, const uint8_t *piece, size_t len, int32_t end,
                           rpcedge_str_t *merged);
int32_t rpcedge_cache_next_store(rpcedge_cache_t *cache, rpcedge_daemon_call_t *call);
int32_t rpcedge_cache_release(rpcedge_cache_t *cache, rpcedge_daemon_call_t *call);
int32_t rpcedge_cache_hit(const rpcedge_cache_t *cache, uint16_t *status, rpcedge_str_t *body);
rpcedge_str_t rpcedge_coding_token(int32_t coding);
int32_t rpcedge_cache_hit_header(const rpcedge_cache_t *cache, size_t index, rpcedge_str_t *name,
                                 rpcedge_str_t *value);
int32_t rpcedge_cache_response_head(rpcedge_cache_t *cache, uint16_t status, int64_t content_length,
                                    const rpcedge_header_t *headers, size_t headers_len);
int32_t rpcedge_cache_store(rpcedge_cache_t *cache, rpcedge_daemon_call_t *call);
int32_t rpcedge_cache_key(rpcedge_cache_t *cache, rpcedge_str_t *key);
int32_t rpcedge_cache_found(rpcedge_cache_t *cache, const uint8_t *entry, size_t len, uint64_t min_length);
int32_t rpcedge_cache_keep(rpcedge_cache_t *cache, const uint8_t *body, size_t len, rpcedge_kept_entry_t *kept);
int32_t rpcedge_cache_may_keep(const rpcedge_cache_t *cache);
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

typedef struct rpcedge_dictionary_t rpcedge_dictionary_t;

typedef struct {
  uint16_t status;
  const rpcedge_header_t *headers;
  size_t headers_len;
  const uint8_t *body;
  size_t body_len;
} rpcedge_dictionary_reply_t;

rpcedge_dictionary_t *rpcedge_dictionary_new(const uint8_t *pattern, size_t len, rpcedge_error_t *err);
int32_t rpcedge_dictionary_reply(const rpcedge_dictionary_t *dictionary, const uint8_t *method, size_t method_len,
                                 const uint8_t *if_none_match, size_t if_none_match_len,
                                 rpcedge_dictionary_reply_t *out);
void rpcedge_dictionary_free(rpcedge_dictionary_t *dictionary);
]]

local lib = ffi.load(os.getenv("RPCEDGE_LIB") or "rpcedge")

-- rpcedge.h's constants
local PLAN_PASS = 0
local EDIT_REMOVE, EDIT_APPEND = 2, 3
local VARY_IN_LINE = 0
local OUT_MORE = 16
local FEED_END = 1
local FEED_FLUSH = 2
local TRANSCODE_REFUSED = 2
local COUNTS_MAX = 5
local CACHE_MAX_ANSWER = 67117122
local CACHE_NODE, CACHE_ASK, CACHE_HIT = 0, 1, 2
local PASS_ON, PASS_KEPT, PASS_HELD, PASS_MERGED = 0, 1, 2, 3

local _M = {
    lib = lib,
    PLAN_PASS = PLAN_PASS,
    EDIT_REMOVE = EDIT_REMOVE,
    EDIT_APPEND = EDIT_APPEND,
    VARY_IN_LINE = VARY_IN_LINE,
    OUT_MORE = OUT_MORE,
    FEED_END = FEED_END,
    FEED_FLUSH = FEED_FLUSH,
    TRANSCODE_REFUSED = TRANSCODE_REFUSED,
    COUNTS_MAX = COUNTS_MAX,
    CACHE_MAX_ANSWER = CACHE_MAX_ANSWER,
    CACHE_NODE = CACHE_NODE,
    CACHE_ASK = CACHE_ASK,
    CACHE_HIT = CACHE_HIT,
    PASS_ON = PASS_ON,
    PASS_KEPT = PASS_KEPT,
    PASS_HELD = PASS_HELD,
    PASS_MERGED = PASS_MERGED,
}


-- The counters: their names once, and the dict that holds their numbers by index.
local counter_names = {}
local ncounters = tonumber(lib.rpcedge_counters())
for i = 0, ncounters - 1 do
    counter_names[i] = C_string(lib.rpcedge_counter_name(i))
end
local counters_dict = "rpcedge_counters"
local counts = ffi_new("rpcedge_count_t[?]", COUNTS_MAX)
-- (the one buffer of this worker that every rpcedge_count_* call fills, for count)
_M.counts = counts


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
_M.count = count


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
_M.rstr = rstr


local function lua_string(s)
    return s.data ~= nil and C_string(s.data, s.len) or nil
end
_M.lua_string = lua_string


-- Keeps Lua strings that an FFI array points to reachable while the core reads them: a local
-- that is not read again may be collected before the call.
local anchor = {}
_M.anchor = anchor


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
_M.header_array = header_array


return _M
