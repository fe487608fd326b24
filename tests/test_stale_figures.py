"""tools/stale_figures.py: a result is stale when what its bench measures changed after the commit
it was measured on, when it was measured on changes not committed, or when it says neither."""

import json
import subprocess
import sys

from testbed.harness import REPO

sys.path.insert(0, str(REPO / "tools"))
import stale_figures  # noqa: E402


def commit_of(*args):
    return subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%H", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def result(tmp_path, commit, dirty=()):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"rows": [], "provenance": {"commit": commit, "dirty": list(dirty)}}))
    return path


def test_a_result_is_stale_once_what_it_measures_changes_and_fresh_until_then(tmp_path):
    # the last commit that changed the nginx module, and the one before it
    changed = commit_of("--", "nginx-module/src")
    before = commit_of(f"{changed}~1")
    stale = stale_figures.why_stale(result(tmp_path, before), ["nginx-module/src"])
    assert stale and "nginx-module/src/" in stale, stale
    assert stale_figures.why_stale(result(tmp_path, changed), ["nginx-module/src"]) is None
    # what it does not measure changed since, not what it does
    assert stale_figures.why_stale(result(tmp_path, before), ["nginx-module/no-such-path"]) is None


def test_a_result_without_provenance_or_measured_on_changes_not_committed_is_stale(tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"rows": []}))
    assert "no provenance" in stale_figures.why_stale(bare, ["nginx-module"])
    dirty = stale_figures.why_stale(result(tmp_path, commit_of(), dirty=["cached/src/store.rs"]), ["cached"])
    assert "cached/src/store.rs" in dirty


def test_a_change_to_the_tests_alone_leaves_a_result_fresh(tmp_path):
    tests = "shared-core/src/cache/tests.rs"
    before = commit_of(f"{commit_of('--', tests)}~1")
    assert stale_figures.why_stale(result(tmp_path, before), [tests, "shared-core/tests"]) is None


def test_a_benchs_harness_counts_for_the_benches_that_name_it_alone(tmp_path):
    harness = "shared-core/benches/compress.rs"
    before = commit_of(f"{commit_of('--', harness)}~1")
    claimer = stale_figures.why_stale(result(tmp_path, before), [harness], [harness])
    assert claimer and harness in claimer
    # a bench that measures the harness's folder, not the harness by name (a glob, so that no other
    # file's later change can make it stale)
    assert stale_figures.why_stale(result(tmp_path, before), [":(glob)shared-core/benches/compress.*"], [harness]) is None
    assert harness in stale_figures.claimed()
