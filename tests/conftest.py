"""pytest fixtures over the harness (testbed/harness.py): the replay upstream for the session, the
fault matrix's mix and stack for a module; how `make test` shares the tests between its
pytest-xdist workers; and which skips it allows (skips_allowed.txt)."""

from pathlib import Path

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


ALLOWED_SKIPS = Path(__file__).with_name("skips_allowed.txt")
skips = []  # (test file, reason) of every skip; under xdist, the controller hears its workers'


def allowed_skips():
    """(test file, the reason's beginning) of each skip skips_allowed.txt allows."""
    lines = [line for line in ALLOWED_SKIPS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return [tuple(line.split(": ", 1)) for line in lines]


def note_skip(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2].removeprefix("Skipped: ")
        skips.append((Path(report.nodeid.split("::")[0]).name, reason))


# a test's skip, and a whole file's (at collection; pytest-xdist hands the controller its workers')
pytest_runtest_logreport = note_skip
pytest_collectreport = note_skip


def unlisted_skips():
    allowed = allowed_skips()
    return sorted({(test_file, reason) for test_file, reason in skips
                   if not any(test_file == listed and reason.startswith(start) for listed, start in allowed)})


def pytest_sessionfinish(session):
    # the controller judges the whole run; a pytest-xdist worker ran only part of it
    if hasattr(session.config, "workerinput"):
        return
    if unlisted_skips() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if unlisted := unlisted_skips():
        terminalreporter.section(f"skips not allowed by {ALLOWED_SKIPS.name}: the run fails", red=True)
        for test_file, reason in unlisted:
            terminalreporter.line(f"{test_file}: {reason}")


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
