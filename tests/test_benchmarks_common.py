"""benchmarks/common.py and benchmarks/tables.py: a perf script's --json carries its run header and the
raw numbers of the table it printed, and the generator renders that JSON back to the same table."""

import json
import subprocess

import pytest

from benchmarks import tables
from benchmarks.common import header_line, render
from benchmarks.perf import launch_count


def test_a_tiny_launch_count_run_writes_json_that_renders_to_its_printed_table(tmp_path, capsys):
    out = tmp_path / "perf" / "launch_count.json"
    launch_count.main(["--size", "32", "--batches", "4", "--calls", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    payload = json.loads(out.read_text())
    assert [p.name for p in out.parent.iterdir()] == ["launch_count.json"]  # atomic: no temp file left
    head = payload["header"]
    assert (
        head["commit"]
        == subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    )
    assert head["device"] == "cpu" and head["torch_threads"] >= 1 and len(head["load_1_5_15"]) == 3
    assert printed.splitlines()[0] == header_line(head)  # the header is what the script prints first
    rows = payload["tables"]["cpu"]["rows"]
    assert [r[:2] for r in rows] == [[4, 1], [4, 4]] and all(r[2] >= r[3] > 0 for r in rows)
    assert "--json" not in payload["argv"] and "json" not in payload["args"]  # no machine path kept
    md = render(payload)
    table = md.split("**cpu**\n\n", 1)[1].strip()
    assert table in printed  # the generated table is the printed one, cell for cell
    assert md.startswith("`python -m benchmarks.perf.launch_count --size 32 --batches 4 --calls 1`")
    assert tables.main([str(out)]) == md


@pytest.mark.parametrize(
    ("text", "expected"), [("{not json", "not a readable JSON"), ('{"script": "x"}', "no 'header' key")]
)
def test_the_generator_refuses_a_file_that_is_no_results_json_in_one_line(tmp_path, capsys, text, expected):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(SystemExit) as e:
        tables.main([str(bad)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and str(bad) in err and expected in err


def test_results_md_publishes_the_committed_perf_json_as_generated():
    """docs/results.md's generated perf tables are those of docs/perf/*.json (edit the JSON by re-running
    the script with --json, then paste `python -m benchmarks.tables`' output; never the numbers by hand)."""
    from pathlib import Path

    from benchmarks.common import markdown_table

    repo = Path(__file__).resolve().parents[1]
    results = (repo / "docs" / "results.md").read_text()
    files = sorted((repo / "docs" / "perf").glob("*.json"))
    assert files, "no committed perf results"
    for f in files:
        payload = tables.load(f)
        assert header_line(payload["header"]) in results, f"{f.name}: its run header is not in results.md"
        for name, t in payload["tables"].items():
            assert markdown_table(t["columns"], t["rows"], t["formats"]) in results, f"{f.name}: table {name}"


def test_the_perturbation_benchmark_prints_the_header_first_and_its_json_holds_the_printed_numbers(
    tmp_path, capsys
):
    """perturbations.py --adapter (its fastest mode: numpy only, one family, 32 px): the printed row and the
    JSON's raw numbers formatted by the table's formats are the same figures."""
    from benchmarks.perf import perturbations

    out = tmp_path / "perturbations.json"
    argv = ["--adapter", "--quick", "--size", "32", "--repeats", "1", "--only", "saturation"]
    perturbations.main([*argv, "--json", str(out)])
    printed = capsys.readouterr().out.splitlines()
    payload = tables.load(out)
    assert printed[0] == header_line(payload["header"]) and payload["argv"] == argv
    t = payload["tables"]["adapter 32x32"]
    (row,) = t["rows"]
    cells = [t["formats"].get(c, "{}").format(v) for c, v in zip(t["columns"], row)]
    assert row[0] == "saturation" and row[1] == 3 and row[2] > 0 and row[3] > 0
    (line,) = [p for p in printed if p.startswith("saturation ")]
    at = 0
    for cell in cells:  # each JSON cell, formatted, stands in the printed row, in the columns' order
        at = line.index(cell, at) + len(cell)


def test_imread_stops_in_one_line_naming_a_file_it_cannot_read(tmp_path):
    """cv2.imread returns None for a missing or broken file (and the benchmark failed later, on indexing);
    benchmarks.common.imread stops there, naming the file. A real image reads as cv2 reads it."""
    import cv2
    import numpy as np

    from benchmarks.common import imread

    broken = tmp_path / "frame.jpg"
    broken.write_bytes(b"not a jpeg")
    for path in (broken, tmp_path / "missing.png"):
        with pytest.raises(SystemExit) as stop:
            imread(path)
        assert str(stop.value) == f"{path}: cannot read this image file (missing, corrupt or not an image)"
    good = tmp_path / "ok.png"
    cv2.imwrite(str(good), np.arange(48, dtype=np.uint8).reshape(4, 4, 3))
    assert np.array_equal(imread(good), cv2.imread(str(good)))
    assert imread(good, cv2.IMREAD_GRAYSCALE).shape == (4, 4)
