"""The Debian mirrors this machine's apt is configured with, for the base image that
docker/engine.sh makes: the archive that serves SUITE and the one that serves SUITE-security,
as shell assignments (MIRROR=..., SECURITY_MIRROR=..., empty where none is configured).

    python3 docker/apt_sources.py bookworm [ETC_APT]

Reads sources.list and sources.list.d/*.list (one-line form) and sources.list.d/*.sources
(deb822), as apt does; entries of other types (deb-src), disabled ones and other suites are
skipped. The first match wins, in apt's order.
"""

import shlex
import sys
from pathlib import Path


def one_line_entries(text):
    """(types, uris, suites) of each `deb [options] uri suite components` line."""
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) < 3:
            continue
        kind, rest = words[0], words[1:]
        if rest[0].startswith("["):
            while rest and not rest[0].endswith("]"):
                rest = rest[1:]
            rest = rest[1:]
        if len(rest) >= 2:
            yield [kind], [rest[0]], [rest[1]]


def deb822_entries(text):
    """(types, uris, suites) of each stanza that is not disabled."""
    for stanza in text.split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[0].isspace():
                continue
            name, value = line.split(":", 1)
            fields[name.strip().lower()] = value.split()
        if fields.get("enabled", ["yes"])[0].lower() == "no":
            continue
        yield fields.get("types", []), fields.get("uris", []), fields.get("suites", [])


def entries(etc):
    files = [etc / "sources.list"] + sorted((etc / "sources.list.d").glob("*"))
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if path.name == "sources.list" or path.suffix == ".list":
            yield from one_line_entries(text)
        elif path.suffix == ".sources":
            yield from deb822_entries(text)


def mirror_for(suite, etc):
    for types, uris, suites in entries(etc):
        if "deb" in types and suite in suites and uris:
            return uris[0].rstrip("/")
    return ""


def main():
    suite = sys.argv[1]
    etc = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/etc/apt")
    print(f"MIRROR={shlex.quote(mirror_for(suite, etc))}")
    print(f"SECURITY_MIRROR={shlex.quote(mirror_for(suite + '-security', etc))}")


if __name__ == "__main__":
    main()
