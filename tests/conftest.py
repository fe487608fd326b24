"""pytest fixtures over the harness (testbed/harness.py): the replay upstream for the session, the
fault matrix's mix and stack for a module; and how `make test` shares the tests between its
pytest-xdist workers."""

import pytest

from testbed import faults
from testbed import judged_load
from testbed.harness import corpus_description, start_replay


def pytest_report_header():
    return f"corpus: {corpus_description()}"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items):
    """Under `--dist loadgroup` a module's tests run on one worker, one after another, as they were
    written to (its fixtures start once); a module that marks a group of its own shares a worker
    with the other modules of that group: the tests on the host's fixed ports and its Docker
    engine ("host"), and the load tests that fill both CPUs ("load")."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(scope="session")
def replay(tmp_path_factory):
    """The replay upstream over the whole corpus, for the session."""
    upstream = start_replay(tmp_path_factory.mktemp("replay"))
    try:
        yield upstream
    finally:
        upstream.process.stop()


@pytest.fixture(scope="module")
def mix_cases():
    """What the fault matrix's clients ask (testbed/judged_load.py), for its short form and the soak's."""
    return judged_load.mix_cases()


@pytest.fixture(scope="module")
def faulted_stack(tmp_path_factory, mix_cases):
    """A cache stack behind Toxiproxy (faults.FaultedStack) for the module."""
    with faults.faulted_stack(tmp_path_factory.mktemp("faulted"), mix_cases) as stack:
        yield stack
