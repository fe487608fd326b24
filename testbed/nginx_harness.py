"""Real nginx (Debian's stock binary) with the rpcedge module loaded, for the end-to-end tests.

Environment:
  RPCEDGE_NGINX_BIN     the nginx binary (default /usr/sbin/nginx)
  RPCEDGE_NGINX_MODULE  the module (default <repo>/build/nginx/objs/ngx_http_rpcedge_filter_module.so,
                        built by `make -C nginx-module`)
  RPCEDGE_NGINX_PRELOAD a library nginx runs with (LD_PRELOAD), e.g. the AddressSanitizer runtime
                        for a module built with it (`make asan`)
"""

import os
import signal
import subprocess
import time
from pathlib import Path

from testbed.harness import LOOPBACK, REPO, Process, StartError, children, free_port

NGINX_BIN = Path(os.environ.get("RPCEDGE_NGINX_BIN", "/usr/sbin/nginx"))
MODULE = Path(os.environ.get("RPCEDGE_NGINX_MODULE",
                             REPO / "build" / "nginx" / "objs" / "ngx_http_rpcedge_filter_module.so"))
STOCK_MODULES = Path("/usr/lib/nginx/modules")
PRELOAD = os.environ.get("RPCEDGE_NGINX_PRELOAD")

LOG_FORMAT = "log_format rpcedge '$request_uri $status $rpcedge_mode $rpcedge_ratio $bytes_sent';"


def main_conf(prefix, http_body, modules=(), workers=1, error_log_level="info", rpcedge=True, main=""):
    """A whole nginx.conf for a test prefix: the rpcedge module unless not `rpcedge` (plus any
    stock `modules`), one master and `workers` workers in the foreground, every path under
    `prefix`, and `main` in the main context. Without rpcedge there is no access log (its format
    uses rpcedge's variables)."""
    prefix = Path(prefix)
    for temp in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (prefix / temp).mkdir(parents=True, exist_ok=True)
    paths = ([MODULE] if rpcedge else []) + [STOCK_MODULES / m for m in modules]
    loads = "".join(f"load_module {path};\n" for path in paths)
    access_log = f"{LOG_FORMAT}\n    access_log {prefix}/access.log rpcedge;" if rpcedge else "access_log off;"
    return f"""{loads}
daemon off;
master_process on;
worker_processes {workers};
user root;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log {error_log_level};
{main}

events {{
    worker_connections 1024;
}}

http {{
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    {access_log}

{http_body}
}}
"""


def preload_env():
    """The environment nginx runs in: this one, with RPCEDGE_NGINX_PRELOAD preloaded if set."""
    return dict(os.environ, LD_PRELOAD=PRELOAD) if PRELOAD else None


def check_conf(path, prefix):
    """`nginx -t` on a config: (exit code, output)."""
    result = subprocess.run([NGINX_BIN, "-t", "-p", prefix, "-c", path], capture_output=True, text=True,
                            env=preload_env())
    return result.returncode, result.stdout + result.stderr


class Nginx:
    def __init__(self, process, prefix, ports):
        self.process = process
        self.prefix = Path(prefix)
        self.ports = ports

    @property
    def port(self):
        return self.ports[0]

    def worker_pids(self, timeout=10):
        """The workers' pids, once the master has started them (it listens before it forks)."""
        master = self.process.proc.pid
        deadline = time.monotonic() + timeout
        while True:
            workers = children(master)
            if workers or time.monotonic() > deadline:
                return workers
            time.sleep(0.05)

    def access_log(self):
        return (self.prefix / "access.log").read_text().splitlines()

    def error_log(self):
        return (self.prefix / "error.log").read_text(errors="replace")

    def stop(self):
        if self.process.proc.poll() is None:
            # graceful: workers finish what they serve
            self.process.proc.send_signal(signal.SIGQUIT)
        self.process.stop()


def start_nginx(prefix, http_body, ports, modules=(), workers=1, name="nginx", argv_prefix=(), rpcedge=True,
                main="", address=LOOPBACK):
    """Starts nginx on `ports` of `address` (all must be listened on by `http_body`) and waits for
    them."""
    if rpcedge and not MODULE.exists():
        raise StartError(f"{MODULE} is missing: run `make -C nginx-module`")
    prefix = Path(prefix)
    prefix.mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(main_conf(prefix, http_body, modules, workers, rpcedge=rpcedge, main=main))
    code, output = check_conf(conf, prefix)
    if code != 0:
        raise StartError(f"nginx -t failed:\n{output}")
    env = preload_env()
    process = Process(name, [*argv_prefix, NGINX_BIN, "-p", prefix, "-c", conf, "-e", prefix / "error.log"],
                      prefix / f"{name}.out", env=env, group=True)
    for port in ports:
        process.wait_for_port(port, host=address)
    return Nginx(process, prefix, ports)


def shipped_conf(name, prefix):
    """configs/nginx/<name> with the module from this build and every path under `prefix`, where
    the files it includes are copied."""
    prefix = Path(prefix)
    prefix.mkdir(parents=True, exist_ok=True)
    for include in ("rpcedge-cache.conf",):
        (prefix / include).write_text((REPO / "configs" / "nginx" / include).read_text())
    text = (REPO / "configs" / "nginx" / name).read_text()
    text = text.replace("/usr/lib/nginx/modules/ngx_http_rpcedge_filter_module.so", str(MODULE))
    if name == "rpcedge.conf":
        # a drop-in snippet: load_module goes in the main context, the rest in http
        load, _, rest = text.partition("\n# --- http ---\n")
        text = main_conf(prefix, rest).replace(f"load_module {MODULE};", load)
    else:
        temps = "".join(f"    {t}_temp_path {prefix / t};\n" for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        text = text.replace("http {\n", "http {\n" + temps, 1)
        for temp in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (prefix / temp).mkdir(parents=True, exist_ok=True)
        text = text.replace("pid /run/nginx.pid;", f"pid {prefix / 'nginx.pid'};\nuser root;\ndaemon off;")
    return text.replace("/var/log/nginx", str(prefix))
