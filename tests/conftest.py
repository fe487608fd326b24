"""pytest fixtures over the harness (testbed/harness.py): the replay upstream for the session."""

import pytest

from testbed.harness import corpus_description, start_replay


def pytest_report_header():
    return f"corpus: {corpus_description()}"


@pytest.fixture(scope="session")
def replay(tmp_path_factory):
    """The replay upstream over the whole corpus, for the session."""
    upstream = start_replay(tmp_path_factory.mktemp("replay"))
    try:
        yield upstream
    finally:
        upstream.process.stop()
