"""The figure tables of RELIABILITY.md and BENCHMARKS.md are what their result files render
(tools/render_tables.py): a figure changed by hand, or a result file rerun without its table, fails."""

import shutil
import subprocess
import sys

import pytest

from testbed.harness import REPO

sys.path.insert(0, str(REPO / "tools"))

import render_tables  # noqa: E402


def test_every_table_is_what_its_result_file_renders():
    for document in render_tables.DOCUMENTS:
        text = (REPO / document).read_text()
        assert render_tables.render(text) == text, f"{document}: run tools/render_tables.py"
    marked = "".join((REPO / document).read_text() for document in render_tables.DOCUMENTS)
    assert all(f"<!-- table: {name} -->" in marked for name in render_tables.TABLES), "every table is placed"


def test_a_figure_changed_by_hand_fails_the_check_and_a_render_puts_it_back(tmp_path):
    for document in render_tables.DOCUMENTS:
        shutil.copy(REPO / document, tmp_path / document)
    shutil.copytree(REPO / "loadtest" / "results", tmp_path / "loadtest" / "results")
    reliability = tmp_path / "RELIABILITY.md"
    text = reliability.read_text()
    table = text.index("<!-- table: faults-matrix -->")
    edited = text[:table] + text[table:].replace("0 wrong", "0 wrong (checked by hand)", 1)
    reliability.write_text(edited)
    check = [sys.executable, REPO / "tools" / "render_tables.py", "--root", tmp_path]
    failed = subprocess.run([*check, "--check"], capture_output=True, text=True)
    assert failed.returncode == 1 and "RELIABILITY.md" in failed.stderr
    assert reliability.read_text() == edited, "--check changes nothing"
    assert subprocess.run(check).returncode == 0
    assert reliability.read_text() == text


def test_a_table_marker_out_of_place_is_an_error_not_a_render_over_the_text():
    table = "<!-- table: faults-matrix -->\nold\n<!-- /table -->\n"
    for broken in (table.replace("<!-- /table -->\n", "") + "prose\n" + table,
                   table.replace("faults-matrix", "faults-matrx"), table.replace("-->\nold", " -->\nold")):
        with pytest.raises(ValueError):
            render_tables.render(broken)
