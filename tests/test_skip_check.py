"""A skip that skips_allowed.txt does not allow fails the run (conftest.py), whether one test
skips or a whole file does at collection, and under pytest-xdist as `make test` runs it."""

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("skipping", [
    "def test_skips():\n    pytest.skip('no such tier here')\n",
    "pytest.skip('no such tier here', allow_module_level=True)\n",
], ids=["a test", "a whole file"])
def test_a_skip_not_on_the_list_fails_the_run(tmp_path, skipping):
    (tmp_path / "test_tier.py").write_text("import pytest\n\n" + skipping)
    (tmp_path / "test_passes.py").write_text("def test_passes():\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                          "-n", "2", tmp_path], cwd=TESTS, env={"PYTHONPATH": str(TESTS)}, capture_output=True,
                         text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "skips not allowed by skips_allowed.txt" in run.stdout and "test_tier.py: no such tier here" in run.stdout
