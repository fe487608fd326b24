"""A real node: geth (built by `make geth` into build/bin, pinned in the Makefile) on a `--dev`
chain of its own, for the real-node tests (tests/test_real_node.py) and `make run NODE=geth`. It
mines a block a second, and a small generator sends it traffic: value transfers, and calls of a
contract that emits a log, from the dev account (unlocked by geth in dev mode).

geth serves JSON-RPC over HTTP and WebSocket on one port and path, `prefix` (`--http.rpcprefix`),
as the example configs' routes name a network's node (`/mainnet`)."""

import json
import os
import threading
import time
import urllib.request
from pathlib import Path

from testbed.harness import LOOPBACK, REPO, Process, StartError, free_port

GETH = Path(os.environ.get("RPCEDGE_GETH", REPO / "build" / "bin" / "geth"))
# the topic the contract's log carries, and its code: LOG1 with no data and that topic, then STOP
LOG_TOPIC = "0x" + "72706365646765".rjust(64, "0")
_RUNTIME = "7f" + LOG_TOPIC[2:] + "60006000a100"
# copy the runtime (0x27 bytes, after this 12-byte prefix) to memory and return it
CONTRACT_INIT = "0x" + "6027600c60003960276000f3" + _RUNTIME


class Geth:
    def __init__(self, workdir, prefix="/mainnet", http_port=None, period=1):
        if not GETH.exists():
            raise StartError(f"{GETH} is missing: run `make geth`")
        self.prefix = prefix
        self.port = http_port or free_port()
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        # An archive node of the hash scheme, as one that serves witnesses of any block is: geth
        # otherwise keeps only the last 128 blocks' state (the path scheme's default, and its
        # archive mode too here), and a witness of an older block is "missing trie node".
        argv = [GETH, "--dev", "--dev.period", str(period), "--datadir", workdir / "geth",
                "--state.scheme", "hash", "--gcmode", "archive",
                "--ipcdisable", "--nodiscover", "--verbosity", "2",
                "--http", "--http.addr", LOOPBACK, "--http.port", self.port, "--http.rpcprefix", prefix,
                "--http.api", "eth,net,web3,debug",
                # WebSocket on the same port and path, as a proxy's one route reaches both
                "--ws", "--ws.addr", LOOPBACK, "--ws.port", self.port, "--ws.rpcprefix", prefix,
                "--ws.api", "eth,net,web3"]
        self.process = Process("geth", argv, workdir / "geth.log")
        self.process.wait_for_port(self.port)
        self.account = self.wait(lambda: (self.call("eth_accounts") or [None])[0], "the dev account")
        self.contract = None

    @property
    def url(self):
        return f"http://{LOOPBACK}:{self.port}{self.prefix}"

    def raw(self, body, headers=None):
        """POSTs `body` to geth directly: its status, headers and body (as geth sent it)."""
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()

    def call(self, method, *params):
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).encode()
        answer = json.loads(self.raw(body)[2])
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    def wait(self, what, describe, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = what()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"geth: no {describe} after {timeout} s; its log:\n{self.process.log_tail()}")

    def receipt(self, tx):
        def mined():
            try:
                return self.call("eth_getTransactionReceipt", tx)
            except RuntimeError as error:
                # a new chain's transaction index is still being built
                if "indexing is in progress" in str(error):
                    return None
                raise
        return self.wait(mined, f"receipt of {tx}")

    def send(self, to=None, value=0, data=None):
        """A transaction from the dev account: its hash."""
        tx = {"from": self.account, "value": hex(value)}
        if to:
            tx["to"] = to
        if data:
            tx["data"] = data
        return self.call("eth_sendTransaction", tx)

    def deploy(self):
        """The log-emitting contract, once: its address."""
        if self.contract is None:
            self.contract = self.receipt(self.send(data=CONTRACT_INIT))["contractAddress"]
        return self.contract

    def traffic(self, transfers=3, logs=3):
        """Value transfers and log-emitting calls: the receipts, once mined."""
        contract = self.deploy()
        sent = [self.send(to="0x" + f"{n + 1:040x}", value=10**15 * (n + 1)) for n in range(transfers)]
        sent += [self.send(to=contract, data="0x" + f"{n:064x}") for n in range(logs)]
        return [self.receipt(tx) for tx in sent]

    def number(self, tag):
        block = self.call("eth_getBlockByNumber", tag, False)
        return int(block["number"], 16) if block else -1

    def wait_final(self, number, timeout=180):
        """Until geth's `finalized` block is at least `number`."""
        self.wait(lambda: self.number("finalized") >= number, f"finalized block {number}", timeout)

    def stop(self):
        self.process.stop()


class TrafficGenerator:
    """Sends geth a value transfer or a contract call every `interval` seconds until stopped, so a
    stack in front of it sees new blocks with transactions and logs (`make run NODE=geth`)."""

    def __init__(self, geth, interval=2.0):
        self.geth, self.interval, self.stopped = geth, interval, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        contract, n = self.geth.deploy(), 0
        while not self.stopped.wait(self.interval):
            try:
                if n % 2:
                    self.geth.send(to=contract, data="0x" + f"{n:064x}")
                else:
                    self.geth.send(to="0x" + f"{n + 1:040x}", value=10**15)
            except (OSError, RuntimeError):
                pass  # geth restarting: the next one
            n += 1

    def stop(self):
        self.stopped.set()
