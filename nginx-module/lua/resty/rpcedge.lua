-- rpcedge for OpenResty: the core's negotiation and one-shot compression through LuaJIT FFI.
--
--     local rpcedge = require "resty.rpcedge"
--     local coding = rpcedge.negotiate(ngx.var.http_accept_encoding)   -- "gzip", "deflate" or nil
--     local packed = rpcedge.compress(body, coding, 6)                 -- nil: send the original
--
-- The shared library is found by ffi.load: set RPCEDGE_LIB (env directive) to its path, or put
-- librpcedge_core.so where the dynamic linker looks.

local ffi = require "ffi"
local base = require "resty.core.base"

local C_string = ffi.string
local get_string_buf = base.get_string_buf
local tonumber = tonumber
local type = type
local error = error

ffi.cdef[[
uint8_t rpcedge_negotiate(const uint8_t *value, size_t len);
size_t rpcedge_compress(uint8_t coding, uint32_t level, const uint8_t *data, size_t len,
                        uint8_t *out, size_t out_cap);
]]

local lib = ffi.load(os.getenv("RPCEDGE_LIB") or "rpcedge_core")

local codings = { "gzip", "deflate" }
local coding_ids = { gzip = 1, deflate = 2 }

local _M = { version = "0.1.0" }


-- The coding to answer with for an Accept-Encoding value (a string, or a table of the repeated
-- header's values as ngx.req.get_headers() gives them), or nil for identity.
function _M.negotiate(accept_encoding)
    if accept_encoding == nil then
        return nil
    end

    if type(accept_encoding) == "table" then
        accept_encoding = table.concat(accept_encoding, ", ")
    end

    return codings[lib.rpcedge_negotiate(accept_encoding, #accept_encoding)]
end


-- Compresses a whole body with libdeflate at `level` (1..12, default 6). Returns the compressed
-- string, or nil when it would not be smaller than the body: then send the body as it is.
function _M.compress(body, coding, level)
    local id = coding_ids[coding or "gzip"]
    if not id then
        error("unsupported coding: " .. tostring(coding), 2)
    end

    level = tonumber(level) or 6
    if level < 1 or level > 12 then
        error("level must be between 1 and 12, got " .. level, 2)
    end

    local len = #body
    if len < 2 then
        return nil
    end

    -- never larger than the body less a byte: the core refuses anything bigger
    local out = get_string_buf(len - 1)
    local n = tonumber(lib.rpcedge_compress(id, level, body, len, out, len - 1))
    if n == 0 then
        return nil
    end

    return C_string(out, n)
end


return _M
