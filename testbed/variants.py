"""The proxies the load test compares, each started on loopback in front of the replay upstream.

Every proxy gets the same treatment: one nginx worker or one Envoy worker thread (--concurrency
1), pinned to its own CPU by the runner, upstream keep-alive, defaults everywhere else. Envoy keeps
the example config's buffer limits (configs/envoy/envoy.yaml) in every Envoy variant.
"""

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.envoy_harness import run_envoy
from testbed.harness import LOOPBACK, StartError, free_port
from testbed.nginx_harness import start_nginx

# The nginx server block of every nginx variant; `compression` goes into its location.
NGINX_SERVER = """
    upstream replay {{
        server {loopback}:{upstream};
        keepalive 64;
    }}

    server {{
        listen {loopback}:{port};
        client_max_body_size 8m;

        location / {{
            proxy_pass http://replay;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
{identity}{compression}
        }}
    }}
"""


def stock_gzip(level):
    return f"""            gzip on;
            gzip_comp_level {level};
            gzip_types application/json;
            gzip_min_length 1024;
            gzip_proxied any;
            gzip_vary on;"""


# ngx_brotli's default level is 6; 4 is the level usually chosen for compressing on the fly: on
# JSON it compresses about as well as gzip 6 for about the CPU of gzip 1 to 6 (the table shows
# where it lands here). Same gates as stock gzip.
BROTLI = """            brotli on;
            brotli_comp_level 4;
            brotli_types application/json;
            brotli_min_length 1024;"""


# What Chromium sends.
BROWSER = "gzip, deflate, br, zstd"


def rpcedge_nginx(level=None):
    """rpcedge on, at a fixed level or (None) with every setting at its default."""
    return "            rpcedge on;" + ("" if level is None else f"\n            rpcedge_level {level};")


def rpcedge_plugin(level=None):
    """The plugin configuration: the defaults, with a fixed one-shot level if given (the cache and
    transcoding are off by default)."""
    return "{}" if level is None else '{"level": %d}' % level


def envoy_compressor(library_settings="", library="gzip"):
    """An http_filters entry for Envoy's compressor filter with one of its libraries (gzip, zstd,
    brotli); their defaults otherwise (min_content_length 30, application/json among its content
    types)."""
    kind = {"gzip": "gzip.compressor.v3.Gzip", "zstd": "zstd.compressor.v3.Zstd", "brotli": "brotli.compressor.v3.Brotli"}
    return f"""          - name: envoy.filters.http.compressor
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor
              compressor_library:
                name: {library}
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.compression.{kind[library]}
{library_settings}"""


# Envoy's gzip at zlib's level 6 with a 32 KiB window (its defaults: level 6, window_bits 12).
GZIP_6_WINDOW_15 = """                  compression_level: COMPRESSION_LEVEL_6
                  window_bits: 15
"""


@dataclass(frozen=True)
class Variant:
    name: str
    host: str  # "direct", "nginx" or "envoy"
    label: str
    nginx_compression: str = ""
    nginx_modules: tuple = ()
    rpcedge: bool = False
    envoy_plugin: str = ""  # rpcedge's plugin configuration, for an Envoy variant with rpcedge
    envoy_filter: str = ""  # the http_filters entry in place of rpcedge's, for one without
    envoy_adapter: str = "wasm"  # rpcedge's Envoy adapter: the proxy-wasm filter or the native module
    accept_encoding: str = "gzip"


VARIANTS = [
    Variant("direct", "direct", "upstream direct"),
    Variant("nginx", "nginx", "nginx, no compression"),
    Variant("nginx-gzip1", "nginx", "nginx gzip 1", nginx_compression=stock_gzip(1)),
    Variant("nginx-gzip6", "nginx", "nginx gzip 6", nginx_compression=stock_gzip(6)),
    # The only variant whose clients also accept br: brotli is what it is there to show.
    Variant("nginx-brotli4", "nginx", "nginx brotli 4", nginx_compression=BROTLI,
            nginx_modules=("ngx_http_brotli_filter_module.so",), accept_encoding="gzip, br"),
    Variant("nginx-rpcedge1", "nginx", "nginx + rpcedge 1", nginx_compression=rpcedge_nginx(1), rpcedge=True),
    Variant("nginx-rpcedge3", "nginx", "nginx + rpcedge 3", nginx_compression=rpcedge_nginx(3), rpcedge=True),
    Variant("nginx-rpcedge5", "nginx", "nginx + rpcedge 5", nginx_compression=rpcedge_nginx(5), rpcedge=True),
    Variant("nginx-rpcedge6", "nginx", "nginx + rpcedge 6", nginx_compression=rpcedge_nginx(6), rpcedge=True),
    Variant("nginx-rpcedge-default", "nginx", "nginx + rpcedge (defaults: level auto)",
            nginx_compression=rpcedge_nginx(), rpcedge=True),
    Variant("envoy", "envoy", "Envoy, no compression"),
    Variant("envoy-gzip", "envoy", "Envoy compressor (defaults)", envoy_filter=envoy_compressor()),
    Variant("envoy-gzip6w15", "envoy", "Envoy compressor 6, window 15",
            envoy_filter=envoy_compressor(GZIP_6_WINDOW_15)),
    Variant("envoy-rpcedge-wasm6", "envoy", "Envoy + rpcedge Wasm 6", envoy_plugin=rpcedge_plugin(6), rpcedge=True),
    Variant("envoy-rpcedge-wasm-default", "envoy", "Envoy + rpcedge Wasm (defaults)", envoy_plugin=rpcedge_plugin(),
            rpcedge=True),
    Variant("envoy-rpcedge-native-default", "envoy", "Envoy + rpcedge native (defaults)",
            envoy_plugin=rpcedge_plugin(), rpcedge=True, envoy_adapter="native"),
    # Fixed levels beside `auto`, for the level it takes by size (loadtest/results/level.md).
    Variant("envoy-rpcedge-native1", "envoy", "Envoy + rpcedge native 1", envoy_plugin=rpcedge_plugin(1),
            rpcedge=True, envoy_adapter="native"),
    Variant("envoy-rpcedge-native3", "envoy", "Envoy + rpcedge native 3", envoy_plugin=rpcedge_plugin(3),
            rpcedge=True, envoy_adapter="native"),
    Variant("envoy-rpcedge-native5", "envoy", "Envoy + rpcedge native 5", envoy_plugin=rpcedge_plugin(5),
            rpcedge=True, envoy_adapter="native"),
    # A browser's Accept-Encoding (Chromium's) against the gzip-only clients above: rpcedge by
    # its defaults sends zstd; and br for a client that takes only br, beside Envoy's zstd and
    # brotli compressors (their defaults) and nginx's brotli module (above).
    Variant("nginx-rpcedge-browser", "nginx", "nginx + rpcedge, browser (zstd)", nginx_compression=rpcedge_nginx(),
            rpcedge=True, accept_encoding=BROWSER),
    Variant("nginx-rpcedge-br", "nginx", "nginx + rpcedge, br", nginx_compression=rpcedge_nginx(), rpcedge=True,
            accept_encoding="br"),
    Variant("envoy-rpcedge-native-browser", "envoy", "Envoy + rpcedge native, browser (zstd)",
            envoy_plugin=rpcedge_plugin(), rpcedge=True, envoy_adapter="native", accept_encoding=BROWSER),
    Variant("envoy-rpcedge-native-br", "envoy", "Envoy + rpcedge native, br", envoy_plugin=rpcedge_plugin(),
            rpcedge=True, envoy_adapter="native", accept_encoding="br"),
    Variant("envoy-zstd", "envoy", "Envoy compressor zstd (defaults)", envoy_filter=envoy_compressor(library="zstd"),
            accept_encoding="zstd"),
    Variant("envoy-brotli", "envoy", "Envoy compressor brotli (defaults)",
            envoy_filter=envoy_compressor(library="brotli"), accept_encoding="br"),
]


class Running:
    """A started variant: where to send requests, whose CPU time to count, its log, how to stop it."""

    def __init__(self, port, cpu_pids, log, stop):
        self.port = port
        self.cpu_pids = cpu_pids  # () for the upstream direct: no proxy to measure
        self.log = log
        self.stop = stop


def worker_pids(nginx, timeout=10):
    """The worker's pid: the master may still be forking it when the port already accepts."""
    deadline = time.monotonic() + timeout
    while not (pids := nginx.worker_pids()):
        if time.monotonic() > deadline:
            nginx.stop()
            raise StartError(f"nginx started no worker; its error log:\n{nginx.error_log()[-3000:]}")
        time.sleep(0.05)
    return tuple(pids)


def start(variant, upstream_port, workdir, argv_prefix=()):
    """Starts `variant` (its proxy under `argv_prefix`, e.g. taskset) in front of the upstream."""
    workdir = Path(workdir) / variant.name
    # a fresh prefix: the logs of an earlier session must not count in this one
    shutil.rmtree(workdir, ignore_errors=True)
    if variant.host == "direct":
        return Running(upstream_port, (), None, lambda: None)
    if variant.host == "nginx":
        port = free_port()
        # stock gzip and brotli need the node's identity asked for by hand; rpcedge asks for it
        identity = "" if variant.rpcedge else '            proxy_set_header Accept-Encoding "";\n'
        http_body = NGINX_SERVER.format(loopback=LOOPBACK, upstream=upstream_port, port=port,
                                        compression=variant.nginx_compression, identity=identity)
        nginx = start_nginx(workdir, http_body, [port], modules=variant.nginx_modules, workers=1,
                            argv_prefix=argv_prefix, rpcedge=variant.rpcedge)
        return Running(port, worker_pids(nginx), nginx.prefix / "error.log", nginx.stop)
    workdir.mkdir(parents=True, exist_ok=True)
    if variant.rpcedge:
        envoy = run_envoy(workdir, upstream_port, plugin_config=variant.envoy_plugin, concurrency=1,
                          argv_prefix=argv_prefix, adapter=variant.envoy_adapter)
    else:
        envoy = run_envoy(workdir, upstream_port, http_filter=variant.envoy_filter, concurrency=1,
                          argv_prefix=argv_prefix)
    return Running(envoy.port, (envoy.process.proc.pid,), envoy.process.log, envoy.process.stop)
