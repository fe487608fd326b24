"""A Redis Cluster on loopback for the fleet tier's tests: Debian's redis-server in cluster mode,
made a cluster with `redis-cli --cluster create`, optionally with an ACL user and TLS; and a small
RESP client that follows MOVED, to plant values and read TTLs as an operator (or an attacker with
access to the cluster) would."""

import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

from .harness import LOOPBACK, Process, StartError, free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
READY_TIMEOUT = 30
# the fleet's secret of the tests and benchmarks (rpcedge-cached --fleet-secret-file)
SECRET = b"a fleet secret of at least thirty-two bytes\n"


def make_certificates(directory):
    """A CA and a server certificate for 127.0.0.1 (an IP SAN: what the cluster announces)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    run = lambda *args: subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
        "-subj", "/CN=rpcedge test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "redis.key", "-out", "redis.csr", "-subj", "/CN=127.0.0.1")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "redis.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "redis.crt", "-days", "2", "-extfile", "san.ext")
    return directory


# Redis Cluster's hash slots
SLOTS = 16384


class RedisCluster:
    """`masters` masters with `replicas` replicas each, in `directory`. With `users`, an ACL user
    per (name, password) with access to rpcedge's keys; with `tls`, TLS only (certificates from
    `make_certificates` in directory/tls). With `announce`, each node tells its clients (and its
    replicas) to dial `announce(port)` instead of its own port: a link that leads to it, such as
    Toxiproxy's; the cluster bus stays direct. With `addresses` (loopback addresses), the n-th node
    listens on the n-th of them instead of 127.0.0.1, as a node of its own would."""

    def __init__(self, directory, masters=3, replicas=1, users=(), tls=False, node_timeout_ms=1000, announce=None,
                 addresses=None):
        if announce and tls:
            raise ValueError("a TLS cluster announces its own ports")
        if addresses and (announce or tls):
            raise ValueError("a cluster on addresses of its own announces them, without TLS")
        self.directory = Path(directory)
        self.tls = self.directory / "tls" if tls else None
        if tls:
            make_certificates(self.tls)
        self.users = list(users)
        self.node_timeout_ms = node_timeout_ms
        self.ports = [free_port() for _ in range(masters * (1 + replicas))]
        if addresses and len(addresses) < len(self.ports):
            raise ValueError(f"{len(self.ports)} nodes, {len(addresses)} addresses")
        self.address = dict(zip(self.ports, addresses or [LOOPBACK] * len(self.ports)))
        # each node's cluster bus: its own free port (the default, port + 10000, may be taken)
        self.bus_ports = {port: free_port() for port in self.ports}
        self.announced = {port: announce(port) if announce else port for port in self.ports}
        self.processes = {}
        for port in self.ports:
            self.start_node(port)
        addresses = [f"{self.address[port]}:{self.announced[port]}" for port in self.ports]
        created = subprocess.run([REDIS_CLI, *self.cli_tls(), "--cluster", "create", *addresses,
                                  "--cluster-replicas", str(replicas), "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60)
        if created.returncode != 0:
            self.stop()
            raise StartError(f"redis-cli --cluster create failed: {created.stdout}\n{created.stderr}")
        self.wait_until_ok()
        self.wait_until_replicated()

    @property
    def scheme(self):
        return "rediss" if self.tls else "redis"

    def seeds(self, count=2):
        return ",".join(f"{self.scheme}://{self.address[port]}:{self.announced[port]}" for port in self.ports[:count])

    def daemon_args(self, directory, timeout, password=None, extra=()):
        """rpcedge-cached's arguments for this cluster: three seeds, the fleet's secret (written
        into `directory`), the fleet timeout and, if the cluster has users, the first one's login
        (with `password` instead of its own, for a refused login)."""
        directory = Path(directory)
        (directory / "fleet.secret").write_bytes(SECRET)
        args = ["--fleet", self.seeds(count=3), "--fleet-secret-file", directory / "fleet.secret",
                "--fleet-timeout", timeout]
        if self.users:
            user, own_password = self.users[0]
            (directory / "fleet.password").write_text((password or own_password) + "\n")
            args += ["--fleet-user", user, "--fleet-password-file", directory / "fleet.password"]
        if self.tls:
            args += ["--fleet-ca-file", self.tls / "ca.crt"]
        return [*args, *extra]

    def cli_tls(self):
        return ["--tls", "--cacert", str(self.tls / "ca.crt")] if self.tls else []

    def start_node(self, port):
        node_dir = self.directory / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        config = [f"bind {self.address[port]}", "protected-mode no", "cluster-enabled yes", "cluster-config-file nodes.conf",
                  f"cluster-port {self.bus_ports[port]}", f"cluster-node-timeout {self.node_timeout_ms}", 'save ""', "appendonly no", f"dir {node_dir}",
                  # as the fleet's README asks: a failed master's slots fail alone, the others' are served
                  "cluster-require-full-coverage no"]
        if self.announced[port] != port:
            config += [f"cluster-announce-ip {LOOPBACK}", f"cluster-announce-port {self.announced[port]}",
                       f"cluster-announce-bus-port {self.bus_ports[port]}"]
        elif self.address[port] != LOOPBACK:
            config.append(f"cluster-announce-ip {self.address[port]}")
        if self.tls:
            config += ["port 0", f"tls-port {port}", f"tls-cert-file {self.tls / 'redis.crt'}",
                       f"tls-key-file {self.tls / 'redis.key'}", f"tls-ca-cert-file {self.tls / 'ca.crt'}",
                       "tls-auth-clients no", "tls-cluster yes", "tls-replication yes"]
        else:
            config.append(f"port {port}")
        config += [f"user {name} on >{password} ~rpcedge:* +@all" for name, password in self.users]
        (node_dir / "redis.conf").write_text("\n".join(config) + "\n")
        process = Process(f"redis-{port}", [REDIS_SERVER, str(node_dir / "redis.conf")], node_dir / "redis.log")
        process.wait_for_port(port, host=self.address[port])
        self.processes[port] = process

    def cli(self, port, *args):
        done = subprocess.run([REDIS_CLI, *self.cli_tls(), "-h", self.address[port], "-p", str(port), *args],
                              capture_output=True, text=True, timeout=30)
        return done.stdout.strip()

    def wait_until_ok(self, timeout=READY_TIMEOUT, ports=None):
        """Until every running node (of `ports`) says the cluster is ok: every slot has a master."""
        deadline = time.monotonic() + timeout
        for port in ports or list(self.processes):
            while not self.whole(port):
                if time.monotonic() > deadline:
                    raise StartError(f"the cluster is not ok on {port}: {self.cli(port, 'cluster', 'info')}")
                time.sleep(0.1)

    def whole(self, port):
        """Whether the node says every slot is served (without full coverage required, the
        cluster's state stays ok while a failed master's slots are not)."""
        info = self.cli(port, "cluster", "info")
        return "cluster_state:ok" in info and f"cluster_slots_ok:{SLOTS}" in info

    def wait_until_replicated(self, timeout=READY_TIMEOUT):
        """Until every replica has synced with its master: a replica that never has cannot take
        over (Redis refuses the failover of a replica whose data is too old)."""
        deadline = time.monotonic() + timeout
        for port in list(self.processes):
            while True:
                replication = self.cli(port, "info", "replication")
                if "role:master" in replication or "master_link_status:up" in replication:
                    break
                if time.monotonic() > deadline:
                    raise StartError(f"the replica on {port} never synced: {replication}")
                time.sleep(0.1)

    def masters(self):
        """Ports of the nodes that are masters now."""
        return [port for port in self.processes if "role:master" in self.cli(port, "info", "replication")]

    def used_memory(self, port):
        """The node's used_memory (INFO memory), in bytes."""
        info = self.cli(port, "info", "memory")
        return int(next(line for line in info.splitlines() if line.startswith("used_memory:")).split(":")[1])

    def kill(self, port):
        self.processes.pop(port).proc.kill()

    def stop_all(self):
        for process in self.processes.values():
            process.stop()
        self.processes.clear()

    def start_all(self):
        """Starts every node again with its nodes.conf (the cluster as it was, without its data)."""
        for port in self.ports:
            if port not in self.processes:
                self.start_node(port)
        self.wait_until_ok()
        self.wait_until_replicated()

    def stop(self):
        self.stop_all()

    # A RESP client: enough to plant values and read TTLs.

    def command(self, *args):
        """Runs one command on the master of its key (following MOVED): the reply."""
        port = next(iter(self.processes))
        host = self.address[port]
        for _ in range(5):
            reply = self._command_on(port, args, host)
            if isinstance(reply, RedisError) and str(reply).startswith("MOVED"):
                host, port = str(reply).split()[-1].rsplit(":", 1)
                port = int(port)
                continue
            if isinstance(reply, RedisError):
                raise reply
            return reply
        raise RedisError(f"too many redirections for {args[:2]}")

    def keys(self, pattern="rpcedge:*"):
        """Every key matching `pattern`, over the masters."""
        found = []
        for port in self.masters():
            found += [k.decode() for k in self._command_on(port, ("KEYS", pattern))]
        return sorted(found)

    def _command_on(self, port, args, host=None):
        with socket.create_connection((host or self.address[port], port), timeout=10) as raw:
            connection = raw
            if self.tls:
                context = ssl.create_default_context(cafile=str(self.tls / "ca.crt"))
                connection = context.wrap_socket(raw, server_hostname=LOOPBACK)
            parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
            connection.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
            return _Reader(connection).reply()


class RedisError(Exception):
    pass


class _Reader:
    def __init__(self, connection):
        self.file = connection.makefile("rb")

    def reply(self):
        line = self.file.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            if int(rest) < 0:
                return None
            data = self.file.read(int(rest) + 2)
            return data[:-2]
        if kind == b"*":
            return None if int(rest) < 0 else [self.reply() for _ in range(int(rest))]
        raise RedisError(f"unexpected reply {line!r}")
