"""The fleet simulation's short form (loadtest/fleet_sim.py; `make fleet-sim` runs twenty hosts):
four hosts on addresses of their own, one of them Envoy's native module, on a Redis Cluster of
three masters and three replicas on addresses of theirs."""

import json
import sys

from testbed.harness import REPO

sys.path.insert(0, str(REPO / "loadtest"))

import fleet_sim  # noqa: E402


def test_four_hosts_on_one_fleet_ask_the_node_once_per_call_and_a_dead_master_serves_no_wrong_answer(tmp_path):
    seen = fleet_sim.run(tmp_path / "sim", hosts=4, clients=8, herd_clients=40, herd_blocks=1, latency_calls=40,
                         envoy_every=4)
    json.dumps(seen)  # what the bench writes
    assert seen["envoy_native_hosts"] == 1

    mix = seen["mix"]
    assert mix["wrong"] == 0, mix["wrong_examples"]
    assert mix["stored_calls"] >= 20 and mix["calls_both_bypassed_and_looked_up"] == 0, mix
    # every call of the mix a store kept reached the node once, whichever hosts were asked it; a
    # fleet round that did not answer in time (this machine is shared) sends its request there too
    assert mix["stored_calls"] <= mix["node_requests_for_stored"] <= mix["stored_calls"] + mix["fleet_rounds_unanswered"], mix

    [block] = seen["herds"]["blocks"]
    assert block["every_answer_right"] and 1 <= block["node_requests"] <= 1 + block["fleet_rounds_unanswered"], block

    latency = seen["latency"]
    # (the corpus sample of a clone with nothing beside it has a few dozen stored calls)
    assert latency["pairs"] >= 10 and latency["fleet_hits_counted"] >= latency["pairs"], latency
    assert latency["hosts_measured"] == 4, latency

    assert seen["memory"]["entries"] >= mix["stored_calls"] and seen["memory"]["bytes_per_entry"] > 0, seen["memory"]

    killed = seen["master_killed"]
    assert killed["wrong"] == 0, killed["wrong_examples"]
    assert killed["cluster_whole_after_s"] is not None, killed
    # the node is asked again only for calls whose slot had no master until its replica took over
    # (and for a round that timed out elsewhere)
    timeouts = killed["fleet_counters"].get("fleet_timeouts_total", 0)
    assert killed["node_requests_for_stored"] <= killed["killed_master_entries"] + timeouts, killed
