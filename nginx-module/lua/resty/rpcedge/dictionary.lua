-- resty.rpcedge.dictionary: the location that serves the core's dcz dictionary (RFC 9842), with
-- Use-As-Dictionary naming the RPC paths it is for (a path pattern, "/*" by default), as nginx's
-- rpcedge_dictionary does; the reply (status, headers, body) is the core's.
--
--     location = /rpcedge/dictionary {
--         content_by_lua_block { require("resty.rpcedge").dictionary("/*") }
--     }
--
-- A location makes dcz where its settings' "encodings" list "dcz".

local ffi = require "ffi"
local abi = require "resty.rpcedge.abi"

local lib = abi.lib
local C_string = ffi.string
local ffi_new = ffi.new
local ffi_gc = ffi.gc
local tonumber = tonumber
local error = error
local ngx = ngx

local _M = {}

-- each pattern's replies, made once per worker
local by_pattern = {}


local function replies(pattern)
    local dictionary = by_pattern[pattern]
    if dictionary then
        return dictionary
    end
    local err = ffi_new("rpcedge_error_t")
    dictionary = lib.rpcedge_dictionary_new(pattern, #pattern, err)
    if dictionary == nil then
        error("rpcedge dictionary: " .. C_string(err.message), 2)
    end
    dictionary = ffi_gc(dictionary, lib.rpcedge_dictionary_free)
    by_pattern[pattern] = dictionary
    return dictionary
end


-- Sends the dictionary's reply to this request, from a content handler.
function _M.serve(pattern)
    local dictionary = replies(pattern or "/*")
    local method = ngx.req.get_method()
    local if_none_match = ngx.var.http_if_none_match
    local reply = ffi_new("rpcedge_dictionary_reply_t")
    if lib.rpcedge_dictionary_reply(dictionary, method, #method, if_none_match,
                                    if_none_match and #if_none_match or 0, reply) ~= 0 then
        return ngx.exit(ngx.HTTP_INTERNAL_SERVER_ERROR)
    end
    ngx.status = reply.status
    for i = 0, tonumber(reply.headers_len) - 1 do
        local header = reply.headers[i]
        ngx.header[C_string(header.name, header.name_len)] = C_string(header.value, header.value_len)
    end
    local length = tonumber(reply.body_len)
    if reply.status ~= ngx.HTTP_NOT_MODIFIED then
        ngx.header["Content-Length"] = length
    end
    if length > 0 and method ~= "HEAD" then
        ngx.print(C_string(reply.body, length))
    else
        ngx.send_headers()
    end
    return ngx.exit(ngx.OK)
end


return _M
