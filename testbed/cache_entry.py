"""A cache entry as rpcedge_core::cache::encode lays it out (format 4), for the tests and
benchmarks that put entries to the daemon themselves. The core checks it: the daemon decodes every
entry put to it with the core's decoder, and refuses one it cannot read, so tests/test_cached.py
fails (its PUTs of these entries are asserted 204, and their tails read back) if the two part."""

import struct
import zlib
from collections import namedtuple

# how geth's answers begin and go on before the result: the envelope a host keeps apart
GETH_BEFORE_ID = b'{"jsonrpc":"2.0","id":'
GETH_AFTER_ID = b',"result":'
# no headers kept, none varied on
NO_HEAD = struct.pack("<HH", 0, 0)
PLAIN, DEFLATED = 0, 1


def cache_entry(tail, form=PLAIN, before=GETH_BEFORE_ID, after=GETH_AFTER_ID):
    """An entry whose tail `<result>}` is kept plain or raw-deflated (`form`), without zstd and
    brotli forms (the daemon makes those)."""
    if form not in (PLAIN, DEFLATED):
        raise ValueError(f"no entry form {form!r}")
    data = zlib.compress(tail, 6, -15) if form == DEFLATED else tail
    # the fields, then the CRC-32 of the whole entry but its own field
    fields = struct.pack("<BBIQHHIII", 4, form, zlib.crc32(tail), len(tail), len(before), len(after), len(NO_HEAD),
                         0, 0)
    rest = before + after + NO_HEAD + data
    return fields + struct.pack("<I", zlib.crc32(fields + rest)) + rest


# An entry's fields and parts as cache_entry and the core lay them out: `whole` is the CRC-32 of
# every other byte; the parts follow the 34 bytes of fields in this order.
Layout = namedtuple("Layout", "version form crc length whole before_id after_id head zstd br data")
FIELDS = "<BBIQHHIIII"


def layout(entry):
    """An entry's fields and parts (format 4), read as they lie, nothing checked."""
    version, form, crc, length, before, after, head, zstd, br, whole = struct.unpack_from(FIELDS, entry)
    parts, at = [], struct.calcsize(FIELDS)
    for size in (before, after, head, zstd, br):
        parts.append(entry[at:at + size])
        at += size
    return Layout(version, form, crc, length, whole, *parts, entry[at:])
