"""The soak's short form (testbed/soak.py; `make soak` runs a million requests per host and form):
each host, the cache off and the cache warm, SHORT requests of the mix from wrk beside the fault
matrix's judged clients, while faults come and go. No answer may be wrong, whatever the faults;
every answer is right once they are over. Whether memory, descriptors or the store keep growing
is `make soak`'s to say: a run this short is still in their warm-up."""

import itertools

import pytest

from testbed import faults, proxy_faults, soak
from testbed.envoy_harness import ENVOY_HOSTS

# heavy on both CPUs: one after another with the other load tests (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("load")

# about one wrk run of soak.WRK_SEGMENT_S here
SHORT = 10_000
FAULT_EVERY_S = 2
RELOADS = 3


@pytest.fixture(scope="module")
def requests_file(tmp_path_factory, mix_cases):
    return soak.write_requests(tmp_path_factory.mktemp("soak-requests") / "requests.bin", mix_cases)


@pytest.mark.parametrize("form", soak.FORMS)
@pytest.mark.parametrize("host", faults.HOSTS)
def test_no_answer_is_wrong_while_faults_come_and_go(tmp_path, faulted_stack, mix_cases, requests_file, host,
                                                      form):
    proxy = soak.start_proxy(host, tmp_path, faulted_stack, form)
    try:
        result = soak.soak(faulted_stack, proxy, form, mix_cases, requests_file, SHORT, fault_every_s=FAULT_EVERY_S)
    finally:
        proxy.stop()
    assert result.wrong() == 0, (result.wrk, result.judged, result.after, result.wrong_examples)
    assert not result.unexplained(), (result.unexplained(), result.wrk, result.judged, result.fault_windows)
    assert result.wrk["requests"] >= SHORT and result.wrk["right"] > 1000, (result.wrk, result.errors)
    assert result.judged["right"] > 0, result.judged
    assert set(result.after) == {"right"}, result.after
    assert sum(result.faults.values()) > 0, "no fault came"
    assert result.samples, "nothing was sampled"


def test_a_series_grows_when_its_level_rises_not_when_a_few_samples_jump():
    least, share = soak.ALLOWANCE["proxy_fds"]
    level = [30 + i % 3 for i in range(200)]
    # two single samples far above the rest, late in the run (make soak's OpenResty mix form, 2026-11-27)
    jumps = [58 if i in (160, 175) else value for i, value in enumerate(level)]
    # a rise of one descriptor every 10 samples, the whole run (Envoy's old filter chains held 600 s)
    rising = [value + i // 10 for i, value in enumerate(level)]
    assert not soak.grows(level, least, share)
    assert not soak.grows(jumps, least, share)
    assert soak.grows(rising, least, share)


@pytest.mark.parametrize("host", ENVOY_HOSTS)
def test_envoy_lets_go_of_what_a_reload_replaced_within_the_soaks_drain_time(tmp_path, faulted_stack, monkeypatch,
                                                                             host):
    # Envoy's own drain time (600 s) would hold each reload's old filter chains, listening
    # sockets among them, past a run's quarter: the soak would count them as growth
    monkeypatch.setattr(soak, "DRAIN_TIME_S", 3)
    proxy = soak.start_proxy(host, tmp_path, faulted_stack, "mix")
    try:
        reloads, taken = proxy_faults.of(proxy), itertools.count(1)

        def descriptors():
            return soak.resident(proxy.pids)[1]

        def reload(times):
            for _ in range(times):
                reloads.act("reload")
                reloads.check("reload", next(taken))  # each taken before the next (Envoy reads the file's last)
            return descriptors()

        def drained(at_most=None):
            """Waits until Envoy drains nothing (and holds at most `at_most` descriptors, if given)."""
            proxy_faults.settled(
                lambda: (not proxy.envoy.stats("listener_manager.")["total_filter_chains_draining"]
                         and (at_most is None or descriptors() <= at_most)),
                lambda: (f"{descriptors()} descriptors (at most {at_most} asked), drain time "
                         f"{soak.DRAIN_TIME_S} s: {proxy.envoy.stats('listener_manager.')}"))
            return descriptors()

        # a listener changed in place keeps a second descriptor of each listening socket, once
        reload(1)
        after_one = drained()
        held = reload(RELOADS)
        assert held > after_one, "the reloads held nothing: this test would see nothing let go"
        drained(after_one)
    finally:
        proxy.stop()
