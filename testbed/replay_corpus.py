"""The recorded JSON-RPC corpus read in plain Python, independently of the replay binary: its
files, pairs and placeholder flags, and what the replay should answer for a request.

Formats (see shared/corpus/README.md): `*.json` arrays of {request, response}, `*.tar` bzip2
tarballs holding one such file, `*.io` files of `>> request` / `<< response` lines.
"""

import json
import tarfile
from pathlib import Path


def compact(value):
    """The compact wire form, as the replay writes it (UTF-8, no ASCII escaping)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def canonical(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def corpus_files(corpus):
    """The recording files of a corpus directory, as relative paths in sorted order."""
    corpus = Path(corpus)
    return sorted(str(p.relative_to(corpus)) for p in corpus.rglob("*")
                  if p.is_file() and p.suffix in (".json", ".tar", ".io"))


def index_rows(corpus):
    """index.jsonl rows by relative path ({} when there is no index)."""
    index = Path(corpus) / "index.jsonl"
    if not index.exists():
        return {}
    with open(index, encoding="utf-8") as lines:
        return {row["path"]: row for row in map(json.loads, lines) if row}


def network_of(relative):
    """`<source>__<network>__<name>` gives the network; other names none ("")."""
    parts = Path(relative).name.split("__")
    return parts[1] if len(parts) >= 3 else ""


def read_pairs(path):
    """The (request, response) pairs of one recording file, in order."""
    path = Path(path)
    if path.suffix == ".io":
        pairs, request = [], None
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith(">>"):
                request = json.loads(line[2:])
            elif line.startswith("<<"):
                pairs.append((request, json.loads(line[2:])))
        return pairs
    if path.suffix == ".tar":
        with tarfile.open(path, "r:*") as archive:
            member = next(m for m in archive.getmembers() if m.isfile() and m.name.endswith(".json"))
            tests = json.loads(archive.extractfile(member).read())
    else:
        tests = json.loads(path.read_bytes())
    return [(test["request"], test["response"]) for test in tests]


def request_key(request):
    """What the replay matches requests by: method and canonical params per call (absent params
    as []), ignoring id and jsonrpc; a batch is the list of its calls."""
    def call(c):
        return ["call", c.get("method"), c.get("params", [])] if isinstance(c, dict) else ["not-a-call", c]
    if isinstance(request, list):
        return canonical(["batch", [call(c) for c in request]])
    return canonical(["single", call(request)])


def calls(request):
    return request if isinstance(request, list) else [request]


def with_ids(request, ids):
    """The request with the id of each call that has one replaced by ids[position]."""
    def replace(c, new_id):
        if isinstance(c, dict) and "id" in c:
            c = dict(c)
            c["id"] = new_id
        return c
    replaced = [replace(c, i) for c, i in zip(calls(request), ids)]
    return replaced if isinstance(request, list) else replaced[0]


def live_ids_of(request):
    """The id the replay sees for each call position (null where a call has none)."""
    return [c.get("id") if isinstance(c, dict) else None for c in calls(request)]


def expected_answer(recorded_request, recorded_response, live_ids):
    """The recorded response with ids moved over to the live request: a single call's response
    takes its id; in a batch, each response object takes the live id of the first not yet
    claimed recorded call with an equal id, or keeps its own when none is left."""
    if isinstance(recorded_request, list):
        unclaimed = [canonical(c["id"]) if isinstance(c, dict) and "id" in c else None for c in recorded_request]

        def claim(response_id):
            wanted = canonical(response_id)
            for position, candidate in enumerate(unclaimed):
                if candidate is not None and candidate == wanted:
                    unclaimed[position] = None
                    return position
            return None
    else:
        def claim(_response_id):
            return 0

    def fix(obj):
        if isinstance(obj, dict) and "id" in obj:
            position = claim(obj["id"])
            if position is not None:
                obj = dict(obj)  # keeps the member order
                obj["id"] = live_ids[position]
        return obj

    if isinstance(recorded_response, list):
        return [fix(item) for item in recorded_response]
    return fix(recorded_response)


def single_calls(corpus, network, most):
    """Calls of `network` recorded alone, of different methods, with small answers: what a client
    puts in one batch (ethers v6 and viem batch whatever calls come within a few milliseconds)."""
    calls, methods, rows = [], set(), index_rows(corpus)
    for path in corpus_files(corpus):
        if network_of(path) != network or not path.endswith(".json"):
            continue
        placeholders = [pair["placeholder_response"] for pair in rows.get(path, {}).get("pairs", [])]
        for index, (request, response) in enumerate(read_pairs(corpus / path)):
            if (isinstance(request, dict) and request.get("method") not in methods
                    and not (index < len(placeholders) and placeholders[index])
                    and len(compact(response)) < 4096 and not isinstance(response, list)):
                methods.add(request["method"])
                calls.append({"jsonrpc": "2.0", "method": request["method"], "params": request.get("params", [])})
                if len(calls) == most:
                    return calls
    return calls

