"""nginx's own test suite (nginx-tests, beside the repository in ../shared/nginx-tests) against an
nginx binary, with or without the rpcedge module: every file run as Perl runs it, its TAP read into
subtests, and what failed compared with what the same nginx fails without rpcedge, as listed in
tests/nginx_suite_known_failures/<version>.txt (the version `nginx -v` prints).

rpcedge's drop-in contract (docs/DESIGN.md): with `rpcedge on` in http, the suite passes whatever
stock nginx passes. tests/test_nginx_suite.py holds the module to it; by hand:

    python -m testbed.nginx_suite                   # the whole suite with rpcedge on, against the list
    python -m testbed.nginx_suite --stock           # stock nginx, against the list (make nginx-suite-stock)
    python -m testbed.nginx_suite --stock --write   # ... and the list written anew, reasons kept
    python -m testbed.nginx_suite --variant cache gzip.t gunzip.t

The suite refuses to run as root (nginx's workers would run as nobody, and could not read the
tests' files): as root, every file runs as the system user SUITE_USER, made here if missing, in a
folder of its own under /tmp; whatever that user cannot reach (the suite, the module, a binary
under a private home) is copied there first.

Environment:
  RPCEDGE_NGINX_TESTS        the suite (default: <repo>/../shared/nginx-tests)
  RPCEDGE_NGINX_BIN          the nginx binary (default /usr/sbin/nginx; testbed/nginx_harness.py)
  RPCEDGE_NGINX_MODULES_DIR  that nginx's dynamic modules (default /usr/lib/nginx/modules): the suite
                             loads those `nginx -V` names as =dynamic
  RPCEDGE_NGINX_MODULE       the rpcedge module (testbed/nginx_harness.py)
  RPCEDGE_NGINX_SUITE_JOBS   files run at once (default 6: most of a file's time is spent waiting, and
                             the suite whole took 139 s at 8, 181 s at 6, 429 s at 2, on 2 busy cores)
"""

import argparse
import fnmatch
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.harness import REPO, _die_with_parent
from testbed.nginx_harness import MODULE, NGINX_BIN

SUITE = Path(os.environ.get("RPCEDGE_NGINX_TESTS", REPO.parent / "shared" / "nginx-tests"))
MODULES_DIR = Path(os.environ.get("RPCEDGE_NGINX_MODULES_DIR", "/usr/lib/nginx/modules"))
JOBS = int(os.environ.get("RPCEDGE_NGINX_SUITE_JOBS", "6"))
KNOWN_DIR = REPO / "tests" / "nginx_suite_known_failures"
SUITE_USER = "rpcedge-nginx-tests"
# A file that runs longer than this is stopped and counted as incomplete (the slowest take ~30 s).
FILE_TIMEOUT = 300
# Files that take 10 s and more (most of it waiting, on timers of their own), started first so that
# none of them is left to run alone at the end.
SLOW = ("http_resolver.t", "http_resolver_cname.t", "ssl_ocsp.t", "proxy_ssl_certificate_cache.t",
        "stream_proxy_ssl_certificate_cache.t", "ssl.t", "ssl_certificate_cache.t", "stream_ssl_certificate_cache.t",
        "proxy_cache_use_stale.t", "ssl_crl.t", "ssl_stapling.t", "stream_limit_rate2.t", "stream_ssl_ocsp.t",
        "proxy_cache_lock.t")

# What goes into the suite's http context (TEST_NGINX_GLOBALS_HTTP) in each variant: rpcedge set
# once in http, as the drop-in advises (configs/nginx/rpcedge.conf). The cache's variant turns it
# on with a hot tier (a shared zone in every nginx the suite starts); no daemon: the suite sends no
# JSON-RPC call nor a Beacon-API path, so what the cache does on its exchanges is to decide to
# bypass them, with its handler and filters in the chain, and a lookup could not reach a daemon
# anyway (that needs rpcedge-cache.conf's location in every server, which globals cannot add).
VARIANTS = {
    "stock": None,
    "on": "rpcedge on;",
    "transcode": "rpcedge on; rpcedge_transcode on;",
    "cache": "rpcedge on; rpcedge_cache on; rpcedge_cache_hot rpcedge_suite_hot:1m;",
}

# The files on rpcedge's side of nginx: the body filters it sits among (gzip, gunzip, charset, SSI,
# sub, addition, range, slice, xslt, image_filter, perl's), the headers it edits, proxying and the
# proxy cache (whose keys and variants read Accept-Encoding), subrequests, bodies and upgrades.
# The transcode and cache variants run these; `rpcedge on` runs the whole suite.
SELECTED = ("gzip*", "gunzip*", "charset*", "ssi*", "sub_filter*", "addition*", "range*", "slice*",
            "headers*", "proxy_cache*", "auth_request*", "mirror*", "subrequest*", "body*",
            "not_modified*", "proxy.t", "proxy_chunked*", "proxy_unfinished.t", "proxy_upgrade.t",
            "proxy_websocket.t", "proxy_xar.t", "proxy_store.t", "proxy_intercept_errors.t",
            "image_filter.t", "xslt.t", "perl_gzip.t")

_PLAN = re.compile(r"^1\.\.(\d+)(?:\s*#\s*skip\b\s*(.*))?", re.IGNORECASE)
_RESULT = re.compile(r"^(not )?ok\b\s*(\d+)?\s*(.*)$")
_DIRECTIVE = re.compile(r"(?<!\\)#\s*(TODO|SKIP)\b\s*(.*)$", re.IGNORECASE)


@dataclass
class Subtest:
    number: int
    ok: bool
    description: str
    directive: str | None = None  # "todo" or "skip"
    diagnostics: list = field(default_factory=list)

    @property
    def failed(self):
        """Failed as prove counts it: a TODO's failure is expected."""
        return not self.ok and self.directive != "todo"


@dataclass
class FileResult:
    """One file's run: its TAP read, and how Perl ended."""

    name: str
    exit_code: int | None  # None: stopped at FILE_TIMEOUT
    seconds: float
    output: str
    planned: int | None = None
    skipped: str | None = None  # the whole file skipped, and why
    bailed: str | None = None
    subtests: dict = field(default_factory=dict)  # number -> Subtest

    def incomplete(self):
        """Why the file did not run to its end (None when it did): it died, timed out, bailed out,
        ran more or fewer subtests than it planned, or exited non-zero with all of them passed."""
        if self.exit_code is None:
            return f"stopped after {FILE_TIMEOUT} s"
        if self.bailed is not None:
            return f"bailed out: {self.bailed}"
        if self.skipped is not None:
            return None
        if self.planned is None:
            return f"no plan (exit code {self.exit_code})"
        if len(self.subtests) != self.planned:
            return f"ran {len(self.subtests)} of {self.planned} planned (exit code {self.exit_code})"
        if self.exit_code != 0 and not any(s.failed for s in self.subtests.values()):
            return f"exit code {self.exit_code} with every subtest passed"
        return None

    def failures(self):
        """identity -> what the suite said about it: its failed subtests, and the file as a whole
        where it did not run to its end."""
        found = {f"{self.name} {s.number} {s.description}": "\n".join(s.diagnostics)
                 for s in self.subtests.values() if s.failed}
        why = self.incomplete()
        if why:
            found[f"{self.name} (incomplete)"] = why + "\n" + "\n".join(self.output.splitlines()[-15:])
        return found


def parse_tap(name, output, exit_code, seconds):
    """A file's TAP (Test::More's, stdout and stderr together) read into a FileResult."""
    result = FileResult(name, exit_code, seconds, output)
    last = None
    for line in output.splitlines():
        if plan := _PLAN.match(line):
            result.planned = int(plan.group(1))
            if result.planned == 0:
                result.skipped = (plan.group(2) or "").strip() or "skipped"
            continue
        if line.startswith("Bail out!"):
            result.bailed = line[len("Bail out!"):].strip()
            continue
        if line.startswith("#"):
            if last is not None:
                last.diagnostics.append(line)
            continue
        match = _RESULT.match(line)
        if not match:
            continue
        number = int(match.group(2)) if match.group(2) else len(result.subtests) + 1
        rest, directive = match.group(3), None
        if found := _DIRECTIVE.search(rest):
            directive = found.group(1).lower()
            rest = rest[:found.start()]
        description = rest.strip().removeprefix("- ").strip().replace("\\#", "#")
        last = result.subtests[number] = Subtest(number, match.group(1) is None, description, directive)
    return result


def nginx_version(nginx=NGINX_BIN):
    """What `nginx -v` says the binary is: '1.22.1'."""
    done = subprocess.run([str(nginx), "-v"], capture_output=True, text=True, check=True)
    return re.search(r"nginx/(\S+)", done.stderr + done.stdout).group(1)


def suite_files(patterns=None, suite=SUITE):
    """The suite's files (every one, or those matching any of `patterns`), by name."""
    names = sorted(p.name for p in Path(suite).glob("*.t"))
    if patterns is None:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def suite_user():
    """(uid, gid) of the unprivileged user the suite runs as when this process is root, created
    where it is missing (a system user, no home, no shell); None when this process is not root,
    and the suite runs as it."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SUITE_USER)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home",
                               "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", SUITE_USER],
                              capture_output=True, text=True)
        # 9: made meanwhile by another run
        if done.returncode not in (0, 9):
            raise RuntimeError(f"useradd {SUITE_USER} failed ({done.returncode}): {done.stderr.strip()}")
        entry = pwd.getpwnam(SUITE_USER)
    return entry.pw_uid, entry.pw_gid


def _as(user):
    return {} if user is None else {"user": user[0], "group": user[1], "extra_groups": []}


def _reachable(path, user, test="-r"):
    return subprocess.run(["test", test, str(path)], **_as(user)).returncode == 0


def _for_user(path, user, workdir, test="-r"):
    """`path`, or where it was copied in `workdir` if `user` cannot reach it."""
    path = Path(path).resolve()
    if _reachable(path, user, test):
        return path
    copy = Path(workdir) / "copies" / path.name
    copy.parent.mkdir(exist_ok=True)
    (shutil.copytree if path.is_dir() else shutil.copy2)(path, copy)
    return copy


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_suite(files, logs, http=VARIANTS["on"], nginx=NGINX_BIN, modules_dir=MODULES_DIR, module=MODULE,
              suite=SUITE, jobs=JOBS):
    """Runs `files` of the suite, `jobs` at a time, against `nginx` with `module` loaded and
    `http` in the http context (a VARIANTS value; None: stock nginx, no rpcedge), each file's
    output kept in `logs`; returns their FileResults by name. The suite's own choice of ports
    (Test::Nginx::port holds each port while its file runs) keeps files that run at once apart."""
    logs = Path(logs)
    logs.mkdir(parents=True, exist_ok=True)
    user = suite_user()
    workdir = Path(tempfile.mkdtemp(prefix="rpcedge-nginx-suite-"))
    running = {}
    try:
        if user:
            os.chown(workdir, *user)
        suite = _for_user(suite, user, workdir, "-x")
        nginx = _for_user(nginx, user, workdir, "-x")
        modules_dir = _for_user(modules_dir, user, workdir, "-x")
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(workdir),
            "TEST_NGINX_BINARY": str(nginx),
            "TEST_NGINX_MODULES": str(modules_dir),
        }
        if http is not None:
            if not Path(module).exists():
                raise FileNotFoundError(f"{module} is missing: run `make -C nginx-module`")
            env["TEST_NGINX_GLOBALS"] = f"load_module {_for_user(module, user, workdir)};"
            env["TEST_NGINX_GLOBALS_HTTP"] = http
        waiting, results = sorted(files, key=lambda name: name not in SLOW), {}
        while waiting or running:
            while waiting and len(running) < jobs:
                name = waiting.pop(0)
                tmp = workdir / "tmp" / name
                tmp.mkdir(parents=True)
                if user:
                    os.chown(tmp, *user)
                out = open(logs / f"{name}.out", "wb")
                proc = subprocess.Popen(["perl", str(Path(suite) / name)], cwd=suite, stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT, env=dict(env, TMPDIR=str(tmp)),
                                        start_new_session=True, preexec_fn=_die_with_parent, **_as(user))
                running[name] = (proc, out, time.monotonic())
            time.sleep(0.05)
            for name, (proc, out, started) in list(running.items()):
                seconds = time.monotonic() - started
                if proc.poll() is None and seconds < FILE_TIMEOUT:
                    continue
                timed_out = proc.poll() is None
                # what the file left behind (a daemon of its own, an nginx it did not stop)
                _kill_group(proc)
                proc.wait()
                out.close()
                del running[name]
                output = (logs / f"{name}.out").read_text(errors="replace")
                results[name] = parse_tap(name, output, None if timed_out else proc.returncode, seconds)
        return results
    finally:
        for proc, out, _ in running.values():
            _kill_group(proc)
            proc.wait()
            out.close()
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Known:
    """A list of what an nginx fails on its own: identity -> reason; those that come and go
    (marked "~"); and the files the suite skips whole there, -> why."""

    failures: dict
    flaky: set
    skipped: dict


KNOWN_HEADER = """\
# What stock nginx {version} fails of nginx-tests (../shared/nginx-tests) as shipped, with the Makefile's
# APT packages (Debian's dynamic modules, the Perl modules and daemons the suite uses), each file
# run by testbed/nginx_suite.py as an unprivileged user: mostly what is newer than {version}.
# `make nginx-suite-stock` checks this list; `python -m testbed.nginx_suite --stock --write` writes
# it anew, keeping the reasons. One entry a line: `<file> <subtest> <description> | <reason>`, or
# `<file> (incomplete) | <reason>` for a file that stops early; `~ ` before one that comes and
# goes; `<file> (skipped) | <the suite's reason>` for a file the suite skips whole here."""


def known_path(version):
    return KNOWN_DIR / f"{version}.txt"


def read_known(path):
    """Reads a list: one entry a line, `<identity> | <reason>`, an identity being `<file> <number>
    <description>` for a subtest or `<file> (incomplete)`; `~ ` before one that may fail or pass;
    `<file> (skipped) | <the suite's reason>` for a file skipped whole; `#` starts a comment."""
    known = Known({}, set(), {})
    for line in Path(path).read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        identity, _, reason = line.rpartition(" | ")
        if not identity:
            raise ValueError(f"{path}: no ' | <reason>' in {line!r}")
        if identity.endswith(" (skipped)"):
            known.skipped[identity.removesuffix(" (skipped)")] = reason
            continue
        if identity.startswith("~ "):
            identity = identity[2:]
            known.flaky.add(identity)
        known.failures[identity] = reason
    return known


def write_known(path, results, version, previous=None):
    """Writes the list of what `results` (a stock run) failed and skipped, each with the reason
    `previous` gave it, else a mark to write one; the flaky marks kept, and `previous`'s entries
    for the files that did not run."""
    previous = previous or Known({}, set(), {})
    failures = {i: d for r in results.values() for i, d in r.failures().items()}
    failures.update({i: "" for i in previous.failures if i.split(" ", 1)[0] not in results})
    skipped = {r.name: r.skipped for r in results.values() if r.skipped is not None}
    skipped.update({name: why for name, why in previous.skipped.items() if name not in results})
    lines = [*KNOWN_HEADER.format(version=version).splitlines(), ""]
    for identity in sorted(set(failures) | previous.flaky, key=_order):
        if identity not in failures and identity not in previous.failures:
            continue
        mark = "~ " if identity in previous.flaky else ""
        lines.append(f"{mark}{identity} | {previous.failures.get(identity, 'REASON?')}")
    lines.append("")
    lines.extend(f"{name} (skipped) | {why}" for name, why in sorted(skipped.items()))
    Path(path).write_text("\n".join(lines) + "\n")


def _order(identity):
    name, _, rest = identity.partition(" ")
    number = rest.split(" ", 1)[0]
    return name, int(number) if number.isdigit() else 1 << 30


@dataclass
class Verdict:
    """A run against a list: what failed that the list does not hold (`new`, identity -> the
    suite's diagnostics), what the list holds that passed (`stale`), the files skipped whole that
    stock nginx runs (`new_skips`), and the run's summary."""

    new: dict
    stale: list
    new_skips: dict
    summary: str

    @property
    def ok(self):
        return not self.new and not self.stale and not self.new_skips

    def report(self, limit=40):
        """What went wrong, for a test's failure message: each new failure with the suite's own
        diagnostics (the first `limit`), each stale entry, each new skip."""
        parts = [self.summary]
        if self.new:
            parts.append(f"{len(self.new)} failed that stock nginx passes:")
            for identity, diagnostics in list(self.new.items())[:limit]:
                parts.append(f"  {identity}")
                parts.extend(f"      {line}" for line in diagnostics.splitlines()[:12])
            if len(self.new) > limit:
                parts.append(f"  ... and {len(self.new) - limit} more")
        if self.stale:
            parts.append(f"{len(self.stale)} listed as failing that passed: remove them from the list "
                         "(or mark them '~ ' if they come and go):")
            parts.extend(f"  {identity}" for identity in self.stale)
        if self.new_skips:
            parts.append(f"{len(self.new_skips)} skipped whole that the list has stock nginx run (nginx "
                         "refused the file's config, or a package the Makefile installs is missing):")
            parts.extend(f"  {name}: {why}" for name, why in self.new_skips.items())
        return "\n".join(parts)


def judge(results, known, label):
    """`results` against `known`, on the files that ran (a file skipped whole is judged as one)."""
    ran = {r.name for r in results.values() if r.skipped is None}
    failures = {i: d for r in results.values() for i, d in r.failures().items()}
    new = {i: d for i, d in sorted(failures.items(), key=lambda item: _order(item[0])) if i not in known.failures}
    stale = sorted((i for i in known.failures
                    if i.split(" ", 1)[0] in ran and i not in failures and i not in known.flaky), key=_order)
    new_skips = {r.name: r.skipped for r in results.values() if r.skipped is not None and r.name not in known.skipped}
    subtests = sum(len(r.subtests) for r in results.values())
    skipped = sum(r.skipped is not None for r in results.values())
    slowest = max(results.values(), key=lambda r: r.seconds, default=None)
    summary = (f"nginx-tests, {label}: {len(results)} files ({skipped} skipped whole), {subtests} subtests, "
               f"{len(failures)} failed ({len(failures) - len(new)} of them listed for stock nginx)"
               + (f"; slowest file {slowest.name} {slowest.seconds:.1f} s" if slowest else ""))
    return Verdict(new, stale, new_skips, summary)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="suite files or patterns (default: all; --selected: the selection)")
    parser.add_argument("--stock", action="store_true", help="without rpcedge (the variant 'stock')")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="on")
    parser.add_argument("--selected", action="store_true", help="the files the transcode and cache variants run")
    parser.add_argument("--nginx", type=Path, default=NGINX_BIN)
    parser.add_argument("--modules-dir", type=Path, default=MODULES_DIR)
    parser.add_argument("--module", type=Path, default=MODULE, help="the rpcedge module")
    parser.add_argument("--suite", type=Path, default=SUITE)
    parser.add_argument("--jobs", type=int, default=JOBS)
    parser.add_argument("--logs", type=Path, help="where each file's output goes (default: a new folder)")
    parser.add_argument("--known", type=Path, help="the list (default: KNOWN_DIR/<nginx -v>.txt)")
    parser.add_argument("--write", action="store_true", help="write the list from this run (with --stock)")
    args = parser.parse_args(argv)
    variant = "stock" if args.stock else args.variant
    if args.write and variant != "stock":
        parser.error("--write takes a stock run (--stock)")
    patterns = args.files or (SELECTED if args.selected else None)
    files = suite_files(patterns, args.suite)
    version = nginx_version(args.nginx)
    known_file = args.known or known_path(version)
    logs = args.logs or Path(tempfile.mkdtemp(prefix=f"nginx-suite-{variant}-logs-"))
    # a TERM too stops what the files started (run_suite's finally), as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    results = run_suite(files, logs, VARIANTS[variant], args.nginx, args.modules_dir, args.module, args.suite,
                        args.jobs)
    print(f"{len(files)} files in {time.monotonic() - started:.0f} s; each file's output in {logs}")
    slowest = sorted(results.values(), key=lambda r: -r.seconds)[:10]
    print("slowest: " + ", ".join(f"{r.name} {r.seconds:.1f} s" for r in slowest))
    previous = read_known(known_file) if known_file.exists() else None
    if args.write:
        write_known(known_file, results, version, previous)
        print(f"wrote {known_file}")
        previous = read_known(known_file)
    if previous is None:
        for identity in sorted({i for r in results.values() for i in r.failures()}, key=_order):
            print(f"failed: {identity}")
        print(f"no list for nginx {version} ({known_file})")
        return 1
    verdict = judge(results, previous, f"nginx {version}, {variant}")
    print(verdict.report(limit=1000))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
