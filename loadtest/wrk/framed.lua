-- Fields behind their lengths, as the harness writes the files of the wrk scripts: each field's
-- length in 10 decimal digits, then its bytes. Shared by the scripts (loaded with dofile from
-- their own directory).

local framed = {}

-- Every field of the file at `path`, in order.
function framed.read(path)
  local file = assert(io.open(path, "rb"))
  local data = file:read("*a")
  file:close()
  local fields, at = {}, 1
  while at <= #data do
    local length = tonumber(data:sub(at, at + 9))
    table.insert(fields, data:sub(at + 10, at + 9 + length))
    at = at + 10 + length
  end
  return fields
end

return framed
