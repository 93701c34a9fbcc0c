"""``scripts/merge_results.py``: a suite run in parts becomes one CSV, rows in the order
given; parts whose headers differ are refused by name."""

import csv
from pathlib import Path

import pytest

from script_modules import load_script


@pytest.fixture
def merge_results():
    return load_script("scripts/merge_results.py")


def _write(path: Path, header, rows) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_parts_concatenate_in_order(merge_results, tmp_path):
    a = _write(tmp_path / "a.csv", ["suite", "M", "ms"], [["small", "1", "0.01"], ["small", "64", "0.03"]])
    b = _write(tmp_path / "b.csv", ["suite", "M", "ms"], [["small", "512", "0.2"]])
    out = tmp_path / "out.csv"
    assert merge_results.main([str(out), str(a), str(b)]) == 0
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [["suite", "M", "ms"], ["small", "1", "0.01"], ["small", "64", "0.03"], ["small", "512", "0.2"]]


def test_a_different_header_is_refused_by_name(merge_results, tmp_path, capsys):
    a = _write(tmp_path / "a.csv", ["suite", "M", "ms"], [["small", "1", "0.01"]])
    b = _write(tmp_path / "b.csv", ["suite", "M", "gbps"], [["small", "512", "9"]])
    out = tmp_path / "out.csv"
    assert merge_results.main([str(out), str(a), str(b)]) == 2
    assert "b.csv: header differs" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="empty.csv: empty file"):
        merge_results.merge(out, [tmp_path / "empty.csv"])
