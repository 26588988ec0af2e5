"""Issue 46 ("Trust v5") item 13, the evidence tools: ``report_v4`` / ``archive restore`` on a truncated
``.json.gz`` ended in gzip's EOFError, ``report_v4 --out <a folder>`` in IsADirectoryError, and ``rescore``
on a folder whose name has a comma in Hydra's "Ambiguous value". Each is now one line and exit 2, or works.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from benchmarks.evidence import archive, report_v4, report_v5, rescore
from robusttrain.cli.compose import compose_recipe

RUNS = Path(__file__).resolve().parents[2] / "docs" / "evidence_v4" / "runs"


def _archive(tmp_path: Path, truncate: bool) -> Path:
    """A one-run archive copied from docs/evidence_v4/runs; ``truncate``: its result cut in half (a cut copy)."""
    arc = tmp_path / "runs"
    arc.mkdir()
    for name in ("random_s0.json.gz", "random_s0.config.yaml.gz"):
        shutil.copy(RUNS / name, arc / name)
    if truncate:
        raw = (arc / "random_s0.json.gz").read_bytes()
        (arc / "random_s0.json.gz").write_bytes(raw[: len(raw) // 2])
    return arc


def _one_line_exit_2(capsys, run, text: str) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        run()
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and text in lines[0] and "Traceback" not in err, err


def test_a_truncated_archive_is_one_line_for_the_report_and_for_restore(tmp_path, capsys):
    arc = _archive(tmp_path, truncate=True)
    text = "random_s0.json.gz: not a gzip JSON result (EOFError"
    _one_line_exit_2(
        capsys, lambda: report_v4.main([str(arc), "--conditions", "random", "--seeds", "0"]), text
    )
    out = tmp_path / "restored"
    _one_line_exit_2(capsys, lambda: archive.main(["restore", str(arc), str(out)]), text)
    assert not (out / "random_s0" / "result.json").exists()


def test_report_out_naming_a_folder_is_one_line_before_any_work(tmp_path, capsys):
    arc = _archive(tmp_path, truncate=False)
    folder = tmp_path / "tables"
    folder.mkdir()
    _one_line_exit_2(
        capsys,
        lambda: report_v4.main([str(arc), "--out", str(folder), "--conditions", "random", "--seeds", "0"]),
        f"report_v4: --out {folder}: is a folder; give the file to write",
    )
    assert list(folder.iterdir()) == []


def _comma_paths(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A kept run's config.yaml beside a (deliberately bad) checkpoint, an image folder and an output
    folder, every one under a name with a comma."""
    run = tmp_path / "runs,v4" / "random_s0"
    run.mkdir(parents=True)
    shutil.copy(RUNS / "random_s0" / "config.yaml", run / "config.yaml")
    ckpt = run / "least_loss.ckpt"
    ckpt.write_bytes(b"not a checkpoint")
    folder, out = tmp_path / "images,clinic", tmp_path / "out,put"
    folder.mkdir()
    return ckpt, folder, out


def test_rescore_passes_paths_with_a_comma_to_the_cli(tmp_path):
    ckpt, folder, out = _comma_paths(tmp_path)
    cmd = rescore.cli_command(ckpt, str(folder), str(out), "python")
    cfg = compose_recipe("polyp", [c for c in cmd[5:] if not c.startswith("heldout=")])
    assert (cfg.data.root, cfg.ckpt, cfg.run_dir) == (str(folder), str(ckpt), str(out))


@pytest.mark.slow
def test_rescore_with_comma_paths_reaches_the_checkpoint(tmp_path):
    # end to end: the check reads the comma paths and stops at the (deliberately bad) checkpoint, naming it
    import subprocess

    ckpt, folder, out = _comma_paths(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.evidence.rescore", str(ckpt), str(folder), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "Ambiguous value" not in proc.stderr and str(ckpt) in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("report", [report_v4, report_v5], ids=["v4", "v5"])
def test_both_reports_refuse_a_bad_argument_in_one_line_before_any_work(tmp_path, capsys, report):
    """report_v4 and report_v5 share one command line (report_v4.report_cli): the same checks, in one line."""
    tool = report.__name__.rsplit(".", 1)[1]
    arc, folder, missing = tmp_path / "runs", tmp_path / "tables", tmp_path / "missing"
    arc.mkdir()
    folder.mkdir()
    for argv, text in [
        ([str(missing)], f"{tool}: {missing}: not a folder"),
        ([str(arc), "--out", str(folder)], f"{tool}: --out {folder}: is a folder; give the file to write"),
        ([str(arc), "--seeds", "0,x"], f"{tool}: --seeds '0,x': expected integers"),
        ([str(arc), "--conditions", "nope"], f"{tool}: --conditions: unknown ['nope']"),
        ([str(arc), "--n-boot", "0"], f"{tool}: --n-boot 0: expected a positive number"),
        ([str(arc)], f"{tool}: {arc}: no archived run among"),
    ]:
        _one_line_exit_2(capsys, lambda argv=argv: report.main(argv), text)
    assert list(folder.iterdir()) == []
