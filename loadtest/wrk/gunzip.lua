-- gzip decoded with the machine's zlib (libz.so.1, through LuaJIT's FFI), so that a wrk script
-- compares what a client decodes with the node's answer byte for byte, not only the trailer's
-- CRC-32 and length (which a cache hit's bytes take from the stored entry). Shared by the scripts
-- (loaded with dofile from their own directory).

local ffi = require("ffi")

ffi.cdef[[
typedef struct {
  const unsigned char *next_in; unsigned int avail_in; unsigned long total_in;
  unsigned char *next_out; unsigned int avail_out; unsigned long total_out;
  const char *msg; void *state;
  void *zalloc; void *zfree; void *opaque;
  int data_type; unsigned long adler; unsigned long reserved;
} gunzip_stream;
const char *zlibVersion(void);
int inflateInit2_(gunzip_stream *stream, int window_bits, const char *version, int stream_size);
int inflate(gunzip_stream *stream, int flush);
int inflateReset(gunzip_stream *stream);
int inflateEnd(gunzip_stream *stream);
]]

local zlib = ffi.load("libz.so.1")
local Z_OK, Z_STREAM_END, Z_FINISH = 0, 1, 4
local GZIP_ONLY = 16 + 15 -- a gzip header and trailer, a window of 32 KiB

local gunzip = {}

-- `body` from its byte `from` on, decoded: one gzip member or more (RFC 1952), each whole and
-- checked against its trailer, and nothing after them; nil for anything else, or for more than
-- `limit` decoded bytes.
function gunzip.decode(body, from, limit)
  local stream = ffi.new("gunzip_stream")
  assert(zlib.inflateInit2_(stream, GZIP_ONLY, zlib.zlibVersion(), ffi.sizeof(stream)) == Z_OK)
  local out = ffi.new("unsigned char[?]", limit + 1)
  stream.next_in = ffi.cast("const unsigned char *", body) + (from - 1)
  stream.avail_in = #body - from + 1
  stream.next_out, stream.avail_out = out, limit + 1
  local whole
  repeat
    whole = zlib.inflate(stream, Z_FINISH) == Z_STREAM_END
    -- another member follows (a reset keeps the output where it is)
  until not whole or stream.avail_in == 0 or zlib.inflateReset(stream) ~= Z_OK
  local produced = limit + 1 - stream.avail_out
  zlib.inflateEnd(stream)
  if not whole or produced > limit then return nil end
  return ffi.string(out, produced)
end

return gunzip
