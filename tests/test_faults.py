"""The fault matrix's short form (testbed/faults.py; `make faults` runs every cell longer and writes
RELIABILITY.md's table): each host under the mix while the node or the cache daemon misbehaves
behind Toxiproxy, or the daemon's link to the fleet's Redis Cluster does, or one of them lies
(testbed/liar.py), or one more client misbehaves
(testbed/bad_clients.py), or the proxy itself is reconfigured (well or badly), loses a worker or its
Wasm VM (testbed/proxy_faults.py). No answer may be wrong (a corrupt or cut body presented as
whole, or in a coding the client did not ask for) or garbled, the misbehaving client's included;
no client may be left waiting for nothing but where a failed VM held its request; where the fault
is the cache's, a harmless lie's, a client's or a good reload, every other answer must still be
right; and once the fault is gone, every case is answered right again."""

import pytest

from testbed import bad_clients
from testbed import faults
from testbed import judged_load

# heavy on both CPUs: one after another with the other load tests (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("load")

SHORT = ("node-reset-before-headers", "node-cut-mid-body", "node-never-answers", "node-long-length", "node-garbage",
         "node-unasked-gzip", "daemon-cut", "daemon-sigstop", "daemon-corrupt-store", "daemon-bitflip",
         "daemon-full-disk", "fleet-hung", "client-pipelining", "client-deep-json", "client-long-header",
         "client-close-mid-body", "client-h2-reset")
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
    tally, recovered = faults.run_cell(faulted_stack, proxy, fault, mix_cases, SECONDS)
    assert not any(tally.counts[outcome] + tally.client[outcome] for outcome in judged_load.NEVER), \
        (tally.counts, tally.client, tally.wrong)
    assert sum(tally.counts.values()) > 0
    if fault.client:
        assert sum(tally.client.values()) > 0, "the misbehaving client never finished"
        assert set(tally.client) <= bad_clients.CLIENTS[fault.client].allowed, (tally.client, tally.wrong)
        if "left" in bad_clients.CLIENTS[fault.client].allowed:
            assert tally.client["left"] > 0, f"the client never left mid-body: {tally.client}"
    if not fault.may_hang:
        assert not tally.counts["timeout"], tally.counts
    if fault.all_right:
        assert set(tally.counts) == {"right"}, tally.counts
    assert recovered is not None, f"answers still not right {judged_load.RECOVERY_LIMIT} s after {fault.name} ended"
    assert set(tally.after) == {"right"}, (tally.after, tally.wrong)
