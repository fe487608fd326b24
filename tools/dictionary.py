"""Makes rpcedge's compression dictionary for `dcz` (RFC 9842): zstd's dictionary trainer (COVER,
through the `zstandard` package) over the answers of the shared corpus, so that a small JSON-RPC
answer compresses against JSON-RPC's own vocabulary (member names, hex prefixes, the shapes of
blocks, receipts and logs) rather than against nothing.

dcz takes the dictionary as raw content (a browser primes zstd with the resource's bytes), so what
is written is the trained dictionary's content without its zstd header (magic, id and entropy
tables, whose size libzstd's ZDICT_getDictHeaderSize gives): bytes that every decoder reads the
same way, raw or auto-detecting.

One recording in eight (by a hash of its path) is held out of training; the command prints what
each candidate size makes of the held-out answers under 1 KiB, as a fraction of their plain bytes,
the 40-byte dcz header included, beside zstd without a dictionary. The dictionary's size is the
knee of that curve (docs/compression.md, "Dictionary").

    .venv/bin/python tools/dictionary.py [--corpus ../shared/corpus] [--size 32768] [--out F]

The same corpus always gives the same dictionary: fixed COVER parameters, one thread.
"""

import argparse
import ctypes
import hashlib
import sys
from pathlib import Path

import zstandard

from testbed import replay_corpus as rc

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "shared-core" / "dictionary" / "jsonrpc.dict"
SIZES = [4096, 16384, 32768, 65536, 112640]
TRAIN_MAX = 64 * 1024  # longer answers are long for what they repeat, not for what they share
SMALL = 1024
HEADER = 40  # dcz: 8 bytes of magic, then the dictionary's SHA-256
LEVEL = 3  # the dcz level (compress/dcz.rs)


def answers(corpus):
    """(held_out, answer) of every real answer in the corpus, compact, in a fixed order."""
    rpc = Path(corpus) / "rpc"
    placeholders = {(path, i) for path, row in rc.index_rows(rpc).items()
                    for i, pair in enumerate(row.get("pairs") or []) if pair.get("placeholder_response")}
    for relative in rc.corpus_files(rpc):
        if relative.endswith(".tar"):  # the bzip2 tarballs hold only long answers
            continue
        held_out = hashlib.sha256(relative.encode()).digest()[0] % 8 == 0
        for i, (_, response) in enumerate(rc.read_pairs(rpc / relative)):
            if (relative, i) not in placeholders:
                yield held_out, rc.compact(response)


def train(samples, size):
    """A dictionary of `size` bytes trained on `samples`: its raw content, without the zstd header."""
    trained = zstandard.train_dictionary(size, samples, k=1024, d=8, steps=0, threads=1, level=LEVEL).as_bytes()
    libzstd = ctypes.CDLL("libzstd.so.1")
    libzstd.ZDICT_getDictHeaderSize.restype = ctypes.c_size_t
    header = libzstd.ZDICT_getDictHeaderSize(trained, len(trained))
    if header >= len(trained):  # an error code
        sys.exit("libzstd could not read the trained dictionary's header")
    return trained[header:]


def fraction(small, dictionary):
    if dictionary:
        dictionary = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    compressor = zstandard.ZstdCompressor(level=LEVEL, dict_data=dictionary, write_content_size=True,
                                          write_checksum=False, write_dict_id=False)
    header = HEADER if dictionary else 0
    made = sum(min(len(answer), header + len(compressor.compress(answer))) for answer in small)
    return made / sum(map(len, small))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=REPO.parent / "shared" / "corpus", type=Path)
    parser.add_argument("--size", default=32768, type=int)
    parser.add_argument("--out", default=OUT, type=Path)
    args = parser.parse_args()
    if not (args.corpus / "rpc").is_dir():
        sys.exit(f"no corpus at {args.corpus}: pass --corpus")
    training, small = [], []
    for held_out, answer in answers(args.corpus):
        if held_out:
            if len(answer) < SMALL:
                small.append(answer)
        elif len(answer) <= TRAIN_MAX:
            training.append(answer)
    print(f"{len(training)} answers trained on, {len(small)} held-out answers under {SMALL} B")
    print(f"| dictionary | fraction of identity |\n| --- | ---: |\n| none (zstd {LEVEL}) | {fraction(small, None):.3f} |")
    chosen = None
    for size in sorted(set(SIZES + [args.size])):
        dictionary = train(training, size)
        print(f"| {size // 1024} KiB | {fraction(small, dictionary):.3f} |")
        if size == args.size:
            chosen = dictionary
    args.out.write_bytes(chosen)
    print(f"wrote {args.out} ({len(chosen)} bytes, sha256 {hashlib.sha256(chosen).hexdigest()})")


if __name__ == "__main__":
    main()
