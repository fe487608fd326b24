"""nginx's own test suite (nginx-tests) in an nginx with rpcedge loaded and set once in http, as the
drop-in advises: the suite fails exactly what the same nginx fails without rpcedge
(tests/nginx_suite_known_failures/<version>.txt), the whole suite with `rpcedge on`, and the files
beside rpcedge's part of nginx (testbed/nginx_suite.py's SELECTED) with transcoding and with the
cache on too. A failure that stock nginx does not have is rpcedge's; an entry of the list that
passed fails the test too, so that the list stays true (an entry marked `~` may come and go), and
so does a file skipped whole that stock nginx runs. `make nginx-suite-stock` checks the list itself
against stock nginx (not part of `make test`)."""

import pytest

from testbed import nginx_suite
from testbed.nginx_suite import SELECTED, VARIANTS, judge, known_path, nginx_version, read_known, run_suite, suite_files

# six files at a time (nginx_suite.JOBS), each starting nginx and the suite's own backends: with the
# other load tests
pytestmark = pytest.mark.xdist_group("load")


@pytest.fixture(scope="module")
def known():
    """This nginx's version and the list of what it fails without rpcedge."""
    assert nginx_suite.SUITE.is_dir(), f"nginx-tests is missing at {nginx_suite.SUITE} (RPCEDGE_NGINX_TESTS)"
    version = nginx_version()
    path = known_path(version)
    assert path.exists(), (f"no list of what stock nginx {version} fails ({path}): "
                           "write it with `python -m testbed.nginx_suite --stock --write`")
    return version, read_known(path)


def test_the_suite_takes_the_globals(tmp_path):
    """The suite puts TEST_NGINX_GLOBALS_HTTP into every config it starts nginx with: a directive
    nginx refuses there stops a file that passes with rpcedge on (index.t, beside nothing rpcedge
    does), so a run whose globals went nowhere cannot pass for a run with rpcedge on."""
    results = run_suite(["index.t"], tmp_path / "good", VARIANTS["on"])
    assert results["index.t"].failures() == {}, results["index.t"].output
    results = run_suite(["index.t"], tmp_path / "bad", VARIANTS["on"] + " rpcedge_level 13;")
    assert "index.t (incomplete)" in results["index.t"].failures(), results["index.t"].output


@pytest.mark.parametrize("variant, patterns", [("on", None), ("transcode", SELECTED), ("cache", SELECTED)])
def test_suite_fails_what_stock_nginx_fails(known, variant, patterns, tmp_path):
    version, listed = known
    files = suite_files(patterns)
    # the suite whole (nginx-tests has ~500 files), or the selection (~70)
    assert len(files) > (400 if patterns is None else 60), files
    results = run_suite(files, tmp_path, VARIANTS[variant])
    verdict = judge(results, listed, f"nginx {version} with `{VARIANTS[variant]}`")
    print(verdict.summary)
    assert verdict.ok, verdict.report() + f"\neach file's output: {tmp_path}"
