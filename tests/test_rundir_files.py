"""robusttrain.rundir: every run-directory file has one reader; where two readers disagreed, they agree."""

from __future__ import annotations

import json

import numpy as np

from robusttrain.metamorphic.records import FailureRecord
from robusttrain.mining.bank import FailureBank
from robusttrain.rundir import failures as failures_file
from robusttrain.rundir import sampling as sampling_file


def _rec(case: str, fol: float = 0.3) -> FailureRecord:
    return FailureRecord(
        case_id=case,
        split="train",
        perturbation="blur",
        severity=4,
        params={"sigma": np.array([3.0])},
        seed=1,
        epoch=0,
        src_dice=0.9,
        fol_dice=fol,
        src_iou=0.8,
        fol_iou=0.2,
        index=0,
    )


def test_report_and_replay_read_a_torn_batch_the_same(tmp_path):
    """A run killed mid-flush leaves failure lines without their batch marker: replay (the bank)
    treats them as never written, and so must the report (it used to list them)."""
    bank = FailureBank(tmp_path)
    bank.add(_rec("kept"))
    bank.flush(0)
    torn = [json.dumps({"kind": "failure", "id": "f" * 16, **_rec(c).to_dict()}) for c in ("torn1", "torn2")]
    with open(bank.log_path, "a") as fh:  # the killed writer: complete lines, no marker
        fh.write("\n".join(torn) + "\n")
    reported = sorted(r["case_id"] for r in failures_file.read(tmp_path))
    replayed = sorted(r.case_id for r in FailureBank.load(tmp_path).records())
    assert replayed == ["kept"]
    assert reported == replayed


def test_marker_without_newline_is_torn_for_readers_and_writer(tmp_path):
    """The writer cuts a batch whose marker lacks its newline; readers must not have counted it."""
    bank = FailureBank(tmp_path)
    bank.add(_rec("a"))
    bank.flush(0)
    good = bank.log_path.read_bytes()
    extra = json.dumps({"kind": "failure", "id": "e" * 16, **_rec("b").to_dict()}) + "\n"
    extra += json.dumps({"kind": "batch", "epoch": 1, "seen": [], "n": 1})  # no final newline
    bank.log_path.write_bytes(good + extra.encode())
    assert len(failures_file.read_batches(bank.log_path)) == 1
    assert [r["case_id"] for r in failures_file.read(tmp_path)] == ["a"]
    failures_file.truncate_torn_tail(bank.log_path)
    assert bank.log_path.read_bytes() == good


def test_sampling_weights_malformed_file_reads_as_no_weights(tmp_path, caplog):
    p = sampling_file.path(tmp_path)
    p.parent.mkdir()
    for text in ("[1, 2]", '{"weights": {"blur": "lots"}}', '{"weights": {"blur": -1}}', "{not json"):
        p.write_text(text)
        assert sampling_file.read_weights(tmp_path) == {}
    assert "sampling.json" in caplog.text
