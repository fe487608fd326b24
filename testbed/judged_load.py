"""The mix under load, every answer judged against the node's recording: what the fault matrix
(testbed/faults.py) and the soak (testbed/soak.py) send while a part misbehaves, and how they judge
what comes back.

`LOAD_THREADS` clients send the mix (`mix_cases`) on fresh connections as fast as they are
answered; each answer is judged (`judge`):

    right    the node's answer, whole (decoded equal; a batch, equal as JSON)
    error    a whole response with a status other than 200: the proxy said it failed
    cut      the connection ended before the framing said the response was whole
    timeout  nothing more for CLIENT_TIMEOUT seconds: the client gave up. Must be 0 in every
             cell but one whose fault `may_hang`.
    relayed  a whole 200 whose body is the node's own lie (liar.relayed), passed on
             unchanged: what no proxy can know to be false
    wrong    a whole response with status 200 whose body is not the node's answer (or does not
             decode, or is in a coding the client did not ask for), or more bytes than its
             Content-Length: a corrupt or truncated body presented as whole. Must be 0 in every
             cell.
    garbled  bytes that are no HTTP response (a bad status line, a bad chunk size). Must be 0.

Once a fault is removed, `recovery` measures the time until a round of every kind of request is
right again; then every case is asked once more in each coding, and each of those answers must be
right.
"""

import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from testbed import bad_clients
from testbed import cache_cases as cc
from testbed import wire
from testbed.liar import relayed

OUTCOMES = ("right", "relayed", "error", "cut", "timeout", "wrong", "garbled")
# what a misbehaving client (bad_clients) saw: these and
#   answered  a whole 200 to a request no recording answers (deep JSON): passed on
#   refused   a whole response with a 4xx or 5xx status: the proxy said no
#   left      the client left before the end (it read too slowly, or reset mid-body)
CLIENT_OUTCOMES = ("right", "answered", "refused", "left", "cut", "timeout", "wrong", "garbled")
# outcomes that no cell may have
NEVER = ("wrong", "garbled")
LOAD_THREADS = 16
CLIENT_TIMEOUT = 30
RECOVERY_LIMIT = 60
ACCEPT_ENCODINGS = ("gzip", None, "zstd, gzip")


@dataclass
class Request:
    path: str
    body: bytes
    expected: bytes
    batch: bool = False


def mix_cases():
    """What the clients ask, by kind: answers the cache keeps (blocks, receipts), ones it passes
    (a balance at latest, the block number), traces that stream (over max_buffer) and a batch."""
    blocks = cc.find_all(cc.block_by_hash, limit=8)
    return {
        "block": blocks,
        "receipt": cc.find_all(cc.receipt, limit=8),
        "latest": cc.find_all(cc.at_tag, limit=4) + cc.find_all(cc.not_in_the_table, limit=2),
        "trace": cc.streamed_traces(limit=2),
        "batch": [cc.batch_case()],
    }


def networks(cases):
    return [case.network for kind in cases.values() for case in kind]


HUGE_BATCH = 10_000


def request_of(kind, case, id_):
    if kind == "huge-batch":
        calls = [{**case.request, "id": id_ + n} for n in range(HUGE_BATCH)]
        answers = [{**case.response, "id": id_ + n} for n in range(HUGE_BATCH)]
        return Request(case.path, json.dumps(calls).encode(), json.dumps(answers).encode(), batch=True)
    if kind == "batch":
        return Request(case.path, json.dumps(case.request).encode(), json.dumps(case.response).encode(), batch=True)
    return Request(case.path, case.body(id_), case.answer(id_))


def takes(accept_encoding, coding):
    """Whether a client that sent `accept_encoding` (None: no field) takes a body in `coding`:
    one it named (a client that named none reads it as plain bytes, whatever RFC 9110 allows)."""
    named = [element.split(";")[0].strip().lower() for element in (accept_encoding or "").split(",")]
    return coding in (None, "identity") or coding.lower() in named


def overruns(response):
    """Whether more bytes came than the response's Content-Length says."""
    length = response.header("content-length")
    return length is not None and not response.chunked and len(response.raw) > int(length)


def judge(response, request, accept_encoding, lie=""):
    """One answer's outcome (see the module's notes) for a client that sent `accept_encoding`;
    `lie` is what the node is lying."""
    if overruns(response):
        return "wrong"  # a client stops at Content-Length and takes what it read as whole
    if response.status == 0 or not response.complete:
        return "cut"
    if response.status != 200:
        return "error"
    if not takes(accept_encoding, response.header("content-encoding")):
        return "wrong"
    try:
        body = response.decoded()
    except Exception:  # noqa: BLE001 - a body that does not decode is a wrong one, whatever the cause
        return "wrong"
    try:
        if json.loads(body) == json.loads(request.expected) if request.batch else body == request.expected:
            return "right"
    except ValueError:
        pass  # no JSON: the node's garbage, or wrong
    return "relayed" if relayed(lie, body, request.body, request.expected, request.batch) else "wrong"


def judge_client(seen):
    """What a misbehaving client saw (a bad_clients.Seen): one of CLIENT_OUTCOMES."""
    response, accept_encoding = seen.response, bad_clients.ACCEPT_ENCODING
    if seen.garbled:
        return "garbled"
    if overruns(response):
        return "wrong"
    if seen.left and response.status == 0:
        return "left"  # before any byte of an answer came
    if seen.left:
        # what it read of its answer must still be the answer's: its head, and its body so far
        ok = response.status == 200 and takes(accept_encoding, response.header("content-encoding"))
        return "left" if ok and begins(response, seen.request) else "wrong"
    if response.status == 0 or not response.complete:
        return "cut"
    if response.status != 200:
        return "refused"
    if seen.request is not None:
        return judge(response, seen.request, accept_encoding)
    try:
        # no recording answers it: the node's reply, in a coding the client named, as JSON
        json.loads(response.decoded())
    except Exception:  # noqa: BLE001 - a body that does not decode is a wrong one, whatever the cause
        return "wrong"
    return "answered" if takes(accept_encoding, response.header("content-encoding")) else "wrong"


def begins(response, request):
    """Whether the body read so far decodes to the start of `request`'s answer (None: no
    recording answers it, and any start will do)."""
    if request is None:
        return True
    try:
        return request.expected.startswith(wire.decode_prefix(response.header("content-encoding"), response.body))
    except Exception:  # noqa: BLE001 - bytes that do not decode are no start of the answer
        return False


def misbehave(proxy, name, cases, rng):
    """One round of the misbehaving client `name` against `proxy` (a cache_cases.Proxy):
    (outcome, response) of each answer it read."""
    client = bad_clients.CLIENTS[name]
    port = proxy.h2_port if client.http2 else proxy.port
    if client.kind == "huge-batch":
        # the mix's smallest answer, so that the batch's answer stays some MB
        found = [case for kind in ("block", "receipt", "latest") for case in cases[kind]]
        case = min(found, key=lambda case: len(case.answer()))
    else:
        case = rng.choice(cases[client.kind])
    requests = [request_of(client.kind, case, rng.randrange(1, 1 << 30)) for _ in range(client.requests)]
    seen, outcome = sent(lambda: client.send(port, requests, CLIENT_TIMEOUT))
    return [(outcome, None)] if outcome else [(judge_client(one), one.response) for one in seen]


def sent(send):
    """(what `send` returned, None), or (None, the outcome of what it raised): a client's
    exchange with the proxy."""
    try:
        return send(), None
    except TimeoutError:
        return None, "timeout"
    except (AssertionError, OSError):  # a head cut short (wire.parse asserts its end), a refused connection
        return None, "cut"
    except (IndexError, ValueError):  # a status line or a chunk size that does not parse
        return None, "garbled"


def ask(port, request, accept_encoding, lie=""):
    response, outcome = sent(lambda: wire.request(port, request.path, "POST", {"Content-Type": "application/json"},
                                                  request.body, accept_encoding=accept_encoding,
                                                  timeout=CLIENT_TIMEOUT))
    return (outcome, None) if outcome else (judge(response, request, accept_encoding, lie), response)


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)  # under the fault
    after: Counter = field(default_factory=Counter)  # the last round, once recovered
    client: Counter = field(default_factory=Counter)  # what a misbehaving client saw
    # (kind, accept_encoding, status, headers) of the first answers that must never be
    wrong: list = field(default_factory=list)
    # what the cell saw of its fault, in words (how often a memory limit was met)
    notes: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome, kind, accept_encoding, response, counts=None):
        with self.lock:
            (self.counts if counts is None else counts)[outcome] += 1
            if outcome in NEVER and len(self.wrong) < 10:
                self.wrong.append((kind, accept_encoding, response and response.status,
                                   response and response.headers))


def load(proxy, cases, seconds, seed=0, threads=LOAD_THREADS, lie="", misbehaving=""):
    """The mix through `proxy` (a cache_cases.Proxy) from `threads` clients for `seconds`, while
    the node tells `lie` or one more client misbehaves (`misbehaving`, again and again): the
    tally."""
    port, tally, deadline = proxy.port, Tally(), time.monotonic() + seconds
    kinds = [kind for kind, found in cases.items() for _ in found]

    failures = []

    def client(number):
        rng = random.Random(seed * 1000 + number)
        try:
            while time.monotonic() < deadline:
                kind = rng.choice(kinds)
                case, accept_encoding = rng.choice(cases[kind]), rng.choice(ACCEPT_ENCODINGS)
                request = request_of(kind, case, rng.randrange(1, 1 << 30))
                outcome, response = ask(port, request, accept_encoding, lie)
                tally.add(outcome, kind, accept_encoding, response)
        except Exception as error:  # noqa: BLE001 - the harness's own failure, raised below
            failures.append(error)

    def bad_client():
        rng = random.Random(seed)
        try:
            while time.monotonic() < deadline:
                for outcome, response in misbehave(proxy, misbehaving, cases, rng):
                    tally.add(outcome, misbehaving, bad_clients.ACCEPT_ENCODING, response, tally.client)
        except Exception as error:  # noqa: BLE001 - as above
            failures.append(error)

    workers = [threading.Thread(target=client, args=(number,), daemon=True) for number in range(threads)]
    if misbehaving:
        workers.append(threading.Thread(target=bad_client, daemon=True))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(max(0, deadline - time.monotonic()) + CLIENT_TIMEOUT + 10)
    if failures:
        raise RuntimeError(f"a client of the load failed: {failures[0]!r}") from failures[0]
    if any(worker.is_alive() for worker in workers):
        raise RuntimeError("a client of the load still waits for its answer")
    return tally


def recovery(proxy, cases, tally):
    """Seconds from the fault's end to the first round through `proxy` (a cache_cases.Proxy) of
    one request of each kind in each coding that is all right, or None when none is within
    RECOVERY_LIMIT; then every case is asked once more in each coding. A wrong answer in either is
    added to `tally`: what the fault left behind (an answer the cache kept cut) counts as much as
    what went out during it."""
    port, started, recovered = proxy.port, time.monotonic(), None
    while recovered is None and time.monotonic() - started < RECOVERY_LIMIT:
        round_started = time.monotonic()
        outcomes = [after(port, kind, found[0], accept_encoding, tally)
                    for kind, found in cases.items() for accept_encoding in ACCEPT_ENCODINGS]
        if all(outcome == "right" for outcome in outcomes):
            recovered = round_started - started
        else:
            time.sleep(0.2)
    for kind, found in cases.items():
        for case in found:
            for accept_encoding in ACCEPT_ENCODINGS:
                outcome, response = ask(port, request_of(kind, case, 7), accept_encoding)
                tally.add(outcome, f"{kind}, after the fault", accept_encoding, response, tally.after)
    return recovered


def after(port, kind, case, accept_encoding, tally):
    """One request of the recovery; only an answer that must never be is tallied."""
    outcome, response = ask(port, request_of(kind, case, 7), accept_encoding)
    if outcome in NEVER:
        tally.add(outcome, f"{kind}, after the fault", accept_encoding, response)
    return outcome

