"""The soak's short form (testbed/soak.py; `make soak` runs a million requests per host and form):
each host, the cache off and the cache warm, SHORT requests of the mix from wrk beside the fault
matrix's judged clients, while faults come and go. No answer may be wrong, whatever the faults;
every answer is right once they are over. Whether memory, descriptors or the store keep growing
is `make soak`'s to say: a run this short is still in their warm-up."""

import pytest

from testbed import faults, soak

# heavy on both CPUs: one after another with the other load tests (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("load")

# about one wrk run of soak.WRK_SEGMENT_S here
SHORT = 10_000
FAULT_EVERY_S = 2


@pytest.fixture(scope="module")
def requests_file(tmp_path_factory, mix_cases):
    return soak.write_requests(tmp_path_factory.mktemp("soak-requests") / "requests.bin", mix_cases)


@pytest.mark.parametrize("form", soak.FORMS)
@pytest.mark.parametrize("host", faults.HOSTS)
def test_no_answer_is_wrong_while_faults_come_and_go(tmp_path, faulted_stack, mix_cases, requests_file, host,
                                                      form):
    proxy = faults.start_proxy(host, tmp_path, faulted_stack, cache=form == "warm")
    try:
        result = soak.soak(faulted_stack, proxy, form, mix_cases, requests_file, SHORT, fault_every_s=FAULT_EVERY_S)
    finally:
        proxy.stop()
    assert result.wrong() == 0, (result.wrk, result.judged, result.after, result.wrong_examples)
    assert result.wrk["requests"] >= SHORT and result.wrk["right"] > 1000, (result.wrk, result.errors)
    assert result.judged["right"] > 0, result.judged
    assert set(result.after) == {"right"}, result.after
    assert sum(result.faults.values()) > 0, "no fault came"
    assert result.samples, "nothing was sampled"
