"""The stack's nginx and Envoy configurations, rendered from the shipped ones in configs/ (the
single source of the rpcedge parts, which `make run` also uses): inside containers the proxies
listen on the container's interface, find the node and the cache daemon by service name, keep pid
and temp files in /tmp (the root file system is read-only, the user not root), log to the
container's output, and let Prometheus scrape the status page. Envoy's comes twice: with the
native module (envoy-native.yaml, the stack's default: its entry is configs/envoy/
rpcedge-native-filter.yaml, as the tests build it) and with the Wasm filter (envoy-wasm.yaml). Every
substitution must match exactly as often as it says, so a change to configs/ that this no longer
fits fails the build instead of shipping a config that drifted.
"""

from pathlib import Path

from testbed.envoy_harness import EXAMPLE_PLUGIN_CONFIG, native_entry, replace_rpcedge_entry

REPO = Path(__file__).resolve().parent.parent

# where the image keeps Envoy's rpcedge modules
MODULES = "/usr/lib/rpcedge"
HEADER = "# Rendered by docker/render.py from {source}: edit that file, not this one.\n"
TEMPS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def substitute(text, source, substitutions):
    for old, new, count in substitutions:
        found = text.count(old)
        if found != count:
            raise SystemExit(f"{source}: expected {count} of {old!r}, found {found}: update docker/render.py")
        text = text.replace(old, new)
    return HEADER.format(source=source) + text


def nginx_conf():
    source = "configs/nginx/nginx.conf"
    temps = "".join(f"    {temp}_temp_path /tmp/nginx-{temp};\n" for temp in TEMPS)
    return substitute((REPO / source).read_text(), source, [
        ("pid /run/nginx.pid;", "pid /tmp/nginx.pid;", 1),
        ("error_log /var/log/nginx/error.log;", "error_log stderr;", 1),
        ("access_log /var/log/nginx/access.log rpcedge;", "access_log /dev/stdout rpcedge;", 1),
        ("http {\n", "http {\n" + temps, 1),
        ("listen 127.0.0.1:", "listen ", 2),
        ("server 127.0.0.1:18545;", "server replay:18545;", 1),
        ("server 127.0.0.1:18090;", "server cached:18090;", 1),
        # Prometheus scrapes from its container; the port is published on the host's loopback only
        ("allow 127.0.0.1;", "allow 127.0.0.1;\n            allow 10.0.0.0/8;\n            allow 172.16.0.0/12;\n"
                             "            allow 192.168.0.0/16;", 1),
    ])


def rpcedge_cache_conf():
    source = "configs/nginx/rpcedge-cache.conf"
    return substitute((REPO / source).read_text(), source, [])


def envoy_yaml(adapter):
    """The example with the Wasm filter (`wasm`) or the native module (`native`)."""
    source = "configs/envoy/envoy.yaml"
    text = substitute((REPO / source).read_text(), source, [
        ("{address: 127.0.0.1, port_value: 19901}", "{address: 0.0.0.0, port_value: 19901}", 1),
        ("{address: 127.0.0.1, port_value: 18081}", "{address: 0.0.0.0, port_value: 18081}", 1),
        ("{address: 127.0.0.1, port_value: 18545}", "{address: replay, port_value: 18545}", 1),
        ("{address: 127.0.0.1, port_value: 18090}", "{address: cached, port_value: 18090}", 1),
        # service names, not addresses: Docker's DNS resolves them
        ("type: STATIC\n", "type: STRICT_DNS\n", 2),
        ("filename: target/wasm32-wasip1/release/rpcedge_envoy_filter.wasm",
         f"filename: {MODULES}/rpcedge_envoy_filter.wasm", 1),
    ])
    if adapter == "native":
        text = replace_rpcedge_entry(text, native_entry(EXAMPLE_PLUGIN_CONFIG, f"{MODULES}/librpcedge_envoy_native.so"))
    return text


def render(directory):
    """Writes the rendered files into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nginx.conf").write_text(nginx_conf())
    (directory / "rpcedge-cache.conf").write_text(rpcedge_cache_conf())
    for adapter in ("native", "wasm"):
        (directory / f"envoy-{adapter}.yaml").write_text(envoy_yaml(adapter))
