-- What a compressed body says of its decoded length, without decoding it: shared by the wrk
-- scripts (loaded with dofile from their own directory).

local sizes = {}

-- The length a gzip trailer states (ISIZE, modulo 2^32).
function sizes.gzip_isize(body)
  local a, b, c, d = body:byte(-4, -1)
  return a + b * 256 + c * 65536 + d * 16777216
end

-- The content size a zstd frame's header states (RFC 8878 3.1.1.1), nil when it states none
-- (a streamed frame).
function sizes.zstd_size(body)
  local descriptor = body:byte(5)
  local size_flag, single = math.floor(descriptor / 64), math.floor(descriptor / 32) % 2
  local at = 6 + (single == 1 and 0 or 1) + ({0, 1, 2, 4})[descriptor % 4 + 1]
  local bytes = ({single == 1 and 1 or 0, 2, 4, 8})[size_flag + 1]
  if bytes == 0 or #body < at + bytes - 1 then return nil end
  local size = 0
  for i = at + bytes - 1, at, -1 do size = size * 256 + body:byte(i) end
  return bytes == 2 and size + 256 or size
end

return sizes
