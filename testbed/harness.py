"""Processes for the end-to-end tests, `make run` and `make bench`: free loopback ports, child
processes that are waited for and always stopped, and the replay upstream.

Environment:
  RPCEDGE_REPLAY_BIN    the replay binary (default: <repo>/target/release/rpcedge-replay; build it
                        with `cargo build --release -p rpcedge-replay`; nothing here builds)
  RPCEDGE_CACHED_BIN    the cache daemon (default: <repo>/target/release/rpcedge-cached)
  RPCEDGE_CORPUS        the recorded pairs (default: the rpc/ folder of CORPUS_ROOT below)
  RPCEDGE_REPLAY_CACHE  the replay's --cache-dir (default: <repo>/target/replay-cache; empty: none)
  RPCEDGE_READY_TIMEOUT seconds to wait for a started process (default: 120)
"""

import contextlib
import ctypes
import errno
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPLAY_BIN = Path(os.environ.get("RPCEDGE_REPLAY_BIN", REPO / "target" / "release" / "rpcedge-replay"))
CACHED_BIN = Path(os.environ.get("RPCEDGE_CACHED_BIN", REPO / "target" / "release" / "rpcedge-cached"))
# The full shared corpus where it is beside the repository (tests and benchmarks), else the sample
# that ships inside it (tools/corpus_sample.py), so that a clone on its own still runs.
SHARED_CORPUS = REPO.parent / "shared" / "corpus"
SAMPLE_CORPUS = REPO / "corpus-sample"
CORPUS_ROOT = SHARED_CORPUS if SHARED_CORPUS.is_dir() else SAMPLE_CORPUS
CORPUS = Path(os.environ.get("RPCEDGE_CORPUS", CORPUS_ROOT / "rpc"))
# The execution witnesses the replay answers debug_executionWitness with.
WITNESSES = CORPUS.parent / "witness" / "ethrex-replay"
SSZ_EXAMPLES = CORPUS.parent / "ssz"
REPLAY_CACHE = os.environ.get("RPCEDGE_REPLAY_CACHE", str(REPO / "target" / "replay-cache"))
READY_TIMEOUT = float(os.environ.get("RPCEDGE_READY_TIMEOUT", "120"))

LOOPBACK = "127.0.0.1"


def corpus_description(corpus=CORPUS):
    """Which corpus a run uses, for its report."""
    kind = "the sample in the repository" if Path(corpus).resolve().parent == SAMPLE_CORPUS.resolve() else "the full corpus"
    return f"{corpus} ({kind})"


def _ports_below_the_ephemeral_range():
    """Candidate ports that the kernel never picks for an outgoing connection or a bind to port 0,
    in an order that differs between processes (two test runs on one machine rarely collide). Each
    pytest-xdist worker, and what it starts, takes its own share of the range first: workers hand
    out ports at once, and a port one handed out may not be bound yet when another looks."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first, last = max(20000, low - 12000), low
    if last - first < 1000:
        first, last = 20000, 30000
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    share = (last - first) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    own_first = first + worker * share
    start = own_first + os.getpid() * 7919 % share
    ports = list(range(first, last))
    return iter(ports[start - first:own_first + share - first] + ports[own_first - first:start - first]
                + ports[own_first + share - first:] + ports[:own_first - first])


_candidate_ports = _ports_below_the_ephemeral_range()


def privileged(argv):
    """Runs `argv` as root (through sudo where the tests are not root, as `make` installs)."""
    done = subprocess.run(argv if os.geteuid() == 0 else ["sudo", "-n", *argv], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


@contextlib.contextmanager
def small_tmpfs(path, size):
    """A tmpfs of `size` (as mount's `size=`) at `path`, this process's to write: a disk to fill."""
    Path(path).mkdir(exist_ok=True)
    privileged(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700,uid={os.getuid()},gid={os.getgid()}",
                "rpcedge-small-disk", str(path)])
    try:
        yield Path(path)
    finally:
        # lazily: a process that still has a file open there must not keep it mounted
        privileged(["umount", "-l", str(path)])


def fill(path):
    """Writes `path` until its file system has no byte left."""
    with open(path, "wb") as filler:
        try:
            while True:
                filler.write(bytes(1 << 20))
                filler.flush()
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise


def free_port():
    """A loopback TCP port that was free a moment ago and that this process has not handed out
    before. A bind to port 0 may return the same port twice in a row (it did, and Envoy's listener
    and admin then collided), and a port from the ephemeral range may be taken meanwhile by any
    outgoing connection; ports below that range, each handed out once, avoid both."""
    for port in _candidate_ports:
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port left below the ephemeral range")


def port_accepts(port, host=LOOPBACK):
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _die_with_parent():
    # A child must not outlive a test run that is killed before its fixtures finish.
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class StartError(RuntimeError):
    """A process did not start serving."""


def _lead_a_group():
    _die_with_parent()
    os.setpgid(0, 0)


def children(pid):
    """The pids of `pid`'s children now (none once it is gone): nginx's workers."""
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Every(threading.Thread):
    """Calls `step(stopping)` again and again until `stopping` (a threading.Event) is set; a
    failure sets it, and is kept (`stop_all` raises it)."""

    def __init__(self, step, stopping, name=None):
        super().__init__(daemon=True, name=name or step.__name__)
        self.step, self.stopping, self.failure = step, stopping, None

    def run(self):
        try:
            while not self.stopping.is_set():
                self.step(self.stopping)
        except Exception as error:  # noqa: BLE001 - the step's failure, raised by stop_all()
            self.failure = error
            self.stopping.set()


def stop_all(workers, stopping):
    """Stops `workers` (Every, on `stopping`) and raises the first one's failure."""
    stopping.set()
    for worker in workers:
        worker.join()
    failed = next((worker for worker in workers if worker.failure), None)
    if failed:
        raise RuntimeError(f"{failed.name} failed: {failed.failure!r}") from failed.failure


class Process:
    """A child process whose stdout and stderr go to `log`; stop() terminates, then kills. With
    `group`, it leads a process group of its own, and stop() also kills what is left in it: the
    processes it started that do not die with it (nginx's workers outlive a killed master, and
    would hold its port)."""

    def __init__(self, name, argv, log, cwd=None, env=None, group=False):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log = Path(log)
        self.group = group
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=cwd, env=env, preexec_fn=_lead_a_group if group else _die_with_parent,
            )

    def log_tail(self, chars=4000):
        return self.log.read_text(errors="replace")[-chars:]

    def wait_for_port(self, port, timeout=READY_TIMEOUT, host=LOOPBACK):
        """Waits until `port` accepts connections; fails the test if the process exits or the
        time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StartError(f"{self.name} exited with {self.proc.returncode} before listening on "
                            f"{host}:{port}; its log ({self.log}):\n{self.log_tail()}")
            if port_accepts(port, host):
                return
            time.sleep(0.1)
        self.stop()
        raise StartError(f"{self.name} not listening on {host}:{port} after {timeout:.0f} s; "
                    f"its log ({self.log}):\n{self.log_tail()}")

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.group:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # nothing left

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class LoopbackService:
    """A running child process serving HTTP/1.1 on a loopback port."""

    # seconds a request may take
    TIMEOUT = 120

    def __init__(self, process, port, host=LOOPBACK):
        self.process = process
        self.host = host
        self.port = port

    def connection(self, timeout=None):
        """A keep-alive connection to the service."""
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.TIMEOUT)

    def request(self, method, path, body=None, headers=None, timeout=None):
        """One request on a fresh connection: (status, headers as an http.client message, body)."""
        return one_request(self.connection(timeout), method, path, body, headers)


# The listen backlog of a stand-in: socketserver's 5 drops a burst's connections past it while the
# accepting thread waits for a CPU, and a dropped SYN is sent again only 1 s later (a lookup of 8
# at once timed out connecting, under make test's load).
STAND_IN_BACKLOG = 128


class StandIn:
    """A test's stand-in server in a thread on loopback: `handler` (a BaseHTTPRequestHandler class,
    or the request handler of another `server` class) answers each request; `port` is where it
    listens (a free one by default)."""

    def __init__(self, handler, port=0, server=ThreadingHTTPServer):
        with_backlog = type(server.__name__, (server,), {"request_queue_size": STAND_IN_BACKLOG})
        self.server = with_backlog((LOOPBACK, port), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def one_request(connection, method, path, body=None, headers=None):
    """One request on `connection`, which is closed after it: (status, headers as an http.client
    message, body)."""
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


class Replay(LoopbackService):
    """A running replay upstream."""

    def __init__(self, process, port, corpus):
        super().__init__(process, port)
        self.corpus = Path(corpus)


def start_replay(log_dir, corpus=CORPUS, args=(), name="rpcedge-replay", port=None, root=None):
    """Starts the replay upstream on a free port and waits until it serves (it listens only once
    its corpus is loaded); witnesses and SSZ examples from the corpus `root` if given. Stop it
    with `.process.stop()`."""
    if not REPLAY_BIN.exists():
        raise StartError(f"{REPLAY_BIN} is missing: run `cargo build --release -p rpcedge-replay`")
    if not Path(corpus).is_dir():
        raise StartError(f"corpus {corpus} is missing (set RPCEDGE_CORPUS)")
    port = port or free_port()
    witnesses, ssz = (root / "witness" / "ethrex-replay", root / "ssz") if root else (WITNESSES, SSZ_EXAMPLES)
    argv = [REPLAY_BIN, "--corpus", corpus, "--witnesses", witnesses, "--ssz-dir", ssz, "--listen", f"{LOOPBACK}:{port}", *args]
    if REPLAY_CACHE:
        argv += ["--cache-dir", REPLAY_CACHE]
    process = Process(name, argv, Path(log_dir) / f"{name}-{port}.log")
    process.wait_for_port(port)
    return Replay(process, port, corpus)


class Cached(LoopbackService):
    """A running cache daemon (rpcedge-cached) on a loopback port, and optionally a Unix socket."""

    TIMEOUT = 30

    def __init__(self, process, port, db, socket_path=None, host=LOOPBACK):
        super().__init__(process, port, host)
        self.db = Path(db)
        self.socket_path = socket_path

    def stats(self):
        status, _, body = self.request("GET", "/v1/stats")
        assert status == 200, body
        return json.loads(body)


def start_cached(log_dir, db, args=(), port=None, socket_path=None, name="rpcedge-cached", tcp=True, argv_prefix=(),
                 address=LOOPBACK):
    """Starts the cache daemon with its store in `db` (under `argv_prefix`, a command that runs
    it) and waits until it serves, on `address` (a loopback one). With tcp=False it listens on
    `socket_path` alone (`--listen none`) and `.port` is None: talk to it over the socket."""
    if not CACHED_BIN.exists():
        raise StartError(f"{CACHED_BIN} is missing: run `cargo build --release -p rpcedge-cached`")
    if not tcp and not socket_path:
        raise ValueError("a daemon without TCP (tcp=False) needs a socket_path")
    port = (port or free_port()) if tcp else None
    argv = [*argv_prefix, CACHED_BIN, "--db", db, "--listen", f"{address}:{port}" if tcp else "none", *args]
    if socket_path:
        argv += ["--socket", socket_path]
    process = Process(name, argv, Path(log_dir) / f"{name}-{port or 'socket'}.log")
    if tcp:
        process.wait_for_port(port, host=address)
        return Cached(process, port, db, socket_path, address)
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1)
            try:
                s.connect(str(socket_path))
                break
            except OSError:
                pass
        if process.proc.poll() is not None or time.monotonic() > deadline:
            process.stop()
            raise StartError(f"{name} not listening on {socket_path} (exit code {process.proc.returncode}); "
                             f"its log ({process.log}):\n{process.log_tail()}")
        time.sleep(0.1)
    return Cached(process, None, db, socket_path)
