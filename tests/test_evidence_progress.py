"""benchmarks/evidence/progress.py: a run's per-epoch validation loss beside Evidence v3's seed-2 runs."""

import json

import pytest

from benchmarks.evidence import progress as evidence_progress


def test_a_finished_run_is_read_from_result_json_and_printed_beside_v3(tmp_path, capsys):
    run = tmp_path / "metamorphic_consistency_s2"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"val_loss": {"0": 0.99, "1": 0.91}}))
    assert evidence_progress.run_val_loss(run) == {0: 0.99, 1: 0.91}
    evidence_progress.main([str(run)])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| run | 0 | 1 |" and out[2] == "| this run | 0.990 | 0.910 |"
    # the archived v3 stalled run of seed 2, epochs 0-1, as committed
    assert "| v3 metamorphic s2 | 1.096 | 0.990 |" in out


def test_a_run_with_neither_file_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="neither result.json nor fit/last.ckpt"):
        evidence_progress.run_val_loss(tmp_path)
