"""pytest fixtures over the harness (harness.py): the replay upstream for the session."""

import pytest

from harness import (CORPUS, LOOPBACK, READY_TIMEOUT, REPLAY_BIN, REPLAY_CACHE, REPO, Process,  # noqa: F401
                     Replay, StartError, corpus_description, free_port, port_accepts, start_replay)


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
