"""The fault matrix's short form (testbed/faults.py; `make faults` runs every cell longer and writes
RELIABILITY.md's table): each host under the mix while the node or the cache daemon misbehaves
behind Toxiproxy, or one of them lies (testbed/liar.py), or one more client misbehaves
(testbed/bad_clients.py). No answer may be wrong (a corrupt or cut body presented as whole, or in
a coding the client did not ask for) or garbled, the misbehaving client's included; where the
fault is the cache's, a harmless lie's or a client's, every other answer must still be right; and
once the fault is gone, every case is answered right again."""

import pytest

from testbed import bad_clients
from testbed import faults

# heavy on both CPUs: one after another with the other load tests (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("load")

SHORT = ("node-reset-before-headers", "node-cut-mid-body", "node-never-answers", "node-long-length", "node-garbage",
         "node-unasked-gzip", "daemon-cut", "daemon-sigstop", "daemon-corrupt-store", "daemon-bitflip",
         "daemon-full-disk", "client-pipelining", "client-deep-json", "client-long-header", "client-close-mid-body",
         "client-h2-reset")
SECONDS = 3


@pytest.fixture(scope="module", params=faults.HOSTS)
def proxy(request, tmp_path_factory, faulted_stack):
    proxy = faults.start_proxy(request.param, tmp_path_factory.mktemp(request.param), faulted_stack)
    yield proxy
    proxy.stop()


@pytest.mark.parametrize("fault", [f for f in faults.FAULTS if f.name in SHORT], ids=lambda f: f.name)
def test_no_answer_is_wrong_under_the_fault_and_all_are_right_after_it(proxy, faulted_stack, fault, mix_cases):
    check_cell(proxy, faulted_stack, fault, mix_cases)


@pytest.mark.parametrize("proxy", faults.NGINX_HOSTS, indirect=True)
@pytest.mark.parametrize("fault", [f for f in faults.FAULTS if f.proxy_signal], ids=lambda f: f.name)
def test_no_answer_is_wrong_while_nginx_reloads_loses_a_worker_or_refuses_a_config(proxy, faulted_stack, fault,
                                                                                   mix_cases):
    check_cell(proxy, faulted_stack, fault, mix_cases)


def check_cell(proxy, faulted_stack, fault, mix_cases):
    tally, recovered = faults.run_cell(faulted_stack, proxy, fault, mix_cases, SECONDS)
    assert not any(tally.counts[outcome] + tally.client[outcome] for outcome in faults.NEVER), \
        (tally.counts, tally.client, tally.wrong)
    assert sum(tally.counts.values()) > 0
    if fault.client:
        assert sum(tally.client.values()) > 0, "the misbehaving client never finished"
        assert set(tally.client) <= bad_clients.CLIENTS[fault.client].allowed, (tally.client, tally.wrong)
        if "left" in bad_clients.CLIENTS[fault.client].allowed:
            assert tally.client["left"] > 0, f"the client never left mid-body: {tally.client}"
    if fault.all_right:
        assert set(tally.counts) == {"right"}, tally.counts
    assert recovered is not None, f"answers still not right {faults.RECOVERY_LIMIT} s after {fault.name} ended"
    assert set(tally.after) == {"right"}, (tally.after, tally.wrong)
