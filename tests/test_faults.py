"""The fault matrix's short form (testbed/faults.py; `make faults` runs every cell longer and writes
RELIABILITY.md's table): each host under the mix while the node or the cache daemon misbehaves
behind Toxiproxy, or the daemon's link to the fleet's Redis Cluster does, or one of them lies
(testbed/liar.py), or one more client misbehaves
(testbed/bad_clients.py), or the proxy itself is reconfigured (well or badly), loses a worker or its
Wasm VM (testbed/proxy_faults.py), or the proxy or the daemon runs out of descriptors
(testbed/descriptors.py). No answer may be wrong (a corrupt or cut body presented as
whole, or in a coding the client did not ask for) or garbled, the misbehaving client's included;
no client may be left waiting for nothing but where a failed VM held its request; where the fault
is the cache's, a harmless lie's, a client's or a good reload, every other answer must still be
right; and once the fault is gone, every case is answered right again."""

import socket
import threading

import pytest

from testbed import faults
from testbed import judged_load
from testbed.wire import LOOPBACK

# heavy on both CPUs: one after another with the other load tests (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("load")

SHORT = ("node-reset-before-headers", "node-cut-mid-body", "node-never-answers", "node-long-length", "node-garbage",
         "node-unasked-gzip", "daemon-cut", "daemon-sigstop", "daemon-corrupt-store", "daemon-bitflip",
         "daemon-full-disk", "fleet-hung", "client-pipelining", "client-deep-json", "client-long-header",
         "client-close-mid-body", "client-h2-reset", "client-smuggling", "daemon-out-of-descriptors",
         "proxy-out-of-descriptors", "client-slowloris", "node-finality-lie",
         "daemon-memory-limit")
SECONDS = 3


@pytest.fixture(scope="module", params=faults.HOSTS)
def proxy(request, tmp_path_factory, faulted_stack):
    proxy = faults.start_proxy(request.param, tmp_path_factory.mktemp(request.param), faulted_stack)
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("fault", [f for f in faults.FAULTS if f.name in SHORT], ids=lambda f: f.name)
def test_no_answer_is_wrong_under_the_fault_and_all_are_right_after_it(proxy, faulted_stack, fault, mix_cases):
    check_cell(proxy, faulted_stack, fault, mix_cases)


@pytest.mark.parametrize("proxy,fault", [(host, fault) for host in faults.HOSTS for fault in faults.FAULTS
                                         if fault.proxy and faults.applies(fault, host)],
                         indirect=["proxy"], ids=lambda param: getattr(param, "name", param))
def test_no_answer_is_wrong_while_the_proxy_reloads_refuses_a_config_or_loses_a_worker_or_vm(proxy, faulted_stack,
                                                                                              fault, mix_cases):
    check_cell(proxy, faulted_stack, fault, mix_cases)


def check_cell(proxy, faulted_stack, fault, mix_cases):
    if reason := faults.unavailable(fault):
        pytest.skip(reason)
    tally, recovered = faults.run_cell(faulted_stack, proxy, fault, mix_cases, SECONDS)
    assert not faults.failures(fault, tally, recovered), (faults.failures(fault, tally, recovered), tally.wrong)


@pytest.mark.parametrize("answer,outcome", [
    (b"", "cut"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "cut"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}", "cut"),
    (b"SSH-2.0-OpenSSH_9.2\r\n", "garbled"),
    (b'{"jsonrpc":"2.0","id":1,"result":"0x1"}', "garbled"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", "wrong"),
], ids=["nothing", "head-cut", "body-cut", "no-http", "headless-body", "whole-but-not-the-answer"])
def test_the_judge_calls_bytes_that_begin_no_response_garbled_not_cut(answer, outcome):
    # Cut is allowed where the node fails, garbled nowhere: a server that answers with bytes that
    # cannot begin an HTTP response (a body with no head at all) must be counted as garbled.
    with socket.create_server((LOOPBACK, 0)) as server:
        def answer_once():
            connection, _ = server.accept()
            with connection:
                connection.recv(1 << 16)
                connection.sendall(answer)
        thread = threading.Thread(target=answer_once)
        thread.start()
        request = judged_load.Request("/", b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}', b'{"id":1}')
        got, _ = judged_load.ask(server.getsockname()[1], request, "gzip")
        thread.join()
    assert got == outcome
