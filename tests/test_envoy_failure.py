"""Envoy's Wasm VM fails (a panic in the filter): with the example's failure policy, the requests
after it are served by a new VM, with rpcedge at work, never a 503 for every request until Envoy
restarts (FAIL_CLOSED, Envoy's default, which the example once had). The panic comes from a build
of the filter with the feature `test-panic` (`make -C envoy-filter wasm-test-panic`): a request
with the header `x-rpcedge-test-panic` makes it panic."""

import time

import pytest

from testbed import wire
from testbed.envoy_harness import EXAMPLE, PANICKING_WASM, run_envoy
from testbed.proxy_faults import PANIC_HEADER
from test_nginx import BUCKETS

# a body worth compressing, which only a live rpcedge compresses
COMPRESSIBLE = BUCKETS["16-256 KiB"]
# Envoy's reload backoff is 1 s; a loaded 2-CPU machine gets the rest
RELOAD_WITHIN_S = 10


@pytest.fixture
def envoy(replay, tmp_path):
    envoy = run_envoy(tmp_path, replay.port, wasm=PANICKING_WASM, concurrency=1)
    yield envoy
    envoy.process.stop()


def served_by_rpcedge(envoy):
    response = wire.request(envoy.port, f"/corpus/{COMPRESSIBLE}")
    return response.status == 200 and response.header("content-encoding") == "gzip"


def test_the_example_reloads_a_failed_vm_and_serves_on(envoy):
    assert "failure_policy: FAIL_RELOAD" in EXAMPLE.read_text()
    assert served_by_rpcedge(envoy)
    for panics in range(3):
        # the request that killed the VM fails, however Envoy ends it
        try:
            failed = wire.request(envoy.port, f"/corpus/{COMPRESSIBLE}", headers={PANIC_HEADER: "1"})
            assert failed.status >= 500 or failed.reset
        except (OSError, ValueError):
            pass
        # the next VM is made once the reload backoff (1 s by default) has passed: rpcedge serves
        # again within a few seconds, and every request after that is its
        deadline = time.monotonic() + RELOAD_WITHIN_S
        while not served_by_rpcedge(envoy):
            assert time.monotonic() < deadline, f"no new VM {RELOAD_WITHIN_S} s after panic {panics}"
            time.sleep(0.1)
        answers = [served_by_rpcedge(envoy) for _ in range(20)]
        assert all(answers), (panics, answers)
    assert "panicked at" in envoy.process.log_tail(200_000)
