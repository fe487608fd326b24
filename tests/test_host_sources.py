"""The hosts are thin adapters: the daemon's protocol and the statuses of replies are the core's
(`cache::protocol`, `HitResponse::STATUS`, `Exchange::failure`), so no host source names a daemon
header, an HTTP method toward the daemon, or a status it answers with on its own. A grep over the
sources as they are in the repository; the hosts' own tests (which play the daemon) are not hosts.
"""

import re

import pytest

from testbed.harness import REPO

HOST_SOURCES = sorted(
    [
        *REPO.glob("nginx-module/src/*.[ch]"),
        *REPO.glob("nginx-module/lua/**/*.lua"),
        *(path for path in REPO.glob("envoy-filter/*/src/*.rs") if path.name != "tests.rs"),
    ]
)

# the client-facing status header the core names, and the Wasm filter's test-only panic header
ALLOWED_HEADERS = r"(?!cache\b|test-panic\b)"

FORBIDDEN = [
    (re.compile(r"x-rpcedge-" + ALLOWED_HEADERS, re.I), "a daemon header"),
    (re.compile(r'"(PUT|DELETE)"|NGX_HTTP_(PUT|DELETE)\b'), "an HTTP method toward the daemon"),
    (
        re.compile(r"\b(200|502)\b|NGX_HTTP_(OK|BAD_GATEWAY)\b|ngx\.HTTP_BAD_GATEWAY|status\s*=\s*ngx\.HTTP_OK"),
        "a status the host decides itself",
    ),
]

# rpcedge_status's page is nginx's own answer, not an exchange's
OWN_PAGES = {"ngx_http_rpcedge_status.c"}


def test_the_host_sources_are_found():
    names = {path.name for path in HOST_SOURCES}
    assert {"ngx_http_rpcedge_cache_module.c", "filter.rs", "lib.rs"} <= names
    assert any(path.suffix == ".lua" for path in HOST_SOURCES)


@pytest.mark.parametrize("path", HOST_SOURCES, ids=lambda path: str(path.relative_to(REPO)))
def test_no_host_names_the_daemons_protocol_or_decides_a_status(path):
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for pattern, what in FORBIDDEN:
            if what.startswith("a status") and path.name in OWN_PAGES:
                continue
            if pattern.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {what}: {line.strip()}")
    assert not found, "\n".join(found)
