"""benchmarks/evidence.py's data protocol on the real sets: disjoint splits, patients kept together,
every PolypGen frame in exactly one centre. Skips when ../shared/data is absent (lists files only)."""
import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import evidence  # noqa: E402

pytestmark = pytest.mark.skipif(not (evidence.DATA / "kvasir_seg").is_dir(), reason="no ../shared/data")


def args(dataset, **kw):
    base = dict(dataset=dataset, size=32, batch_size=4, data_seed=0,
                test_fraction={"polyp": 0.25, "acdc": 0.3}[dataset], val_fraction={"polyp": 0.15, "acdc": 0.3}[dataset])
    return argparse.Namespace(**{**base, **kw})


def test_polyp_split_is_disjoint_and_held_out_sets_are_complete():
    dm, held, in_domain = evidence.build_data(args("polyp"))
    tr, va, te = (set(d.case_ids()) for d in (dm.train_dataset, dm.val_dataset, held["kvasir_test"]))
    assert (len(tr), len(va), len(te)) == (60, 15, 25) and not (tr & va or tr & te or va & te)
    assert in_domain == ["kvasir_test"]
    centres = {k: len(v) for k, v in held.items() if k.startswith("polypgen_")}
    assert sorted(centres) == [f"polypgen_C{i}" for i in range(1, 7)] and sum(centres.values()) == 26
    assert (len(held["cvc_clinicdb"]), len(held["cvc_colondb"]), len(held["etis"])) == (6, 19, 4)
    # the split depends on the data seed only
    dm2, held2, _ = evidence.build_data(args("polyp"))
    assert set(held2["kvasir_test"].case_ids()) == te and set(dm2.val_dataset.case_ids()) == va


def test_acdc_split_keeps_both_phases_of_a_patient_together():
    if not (evidence.DATA / "acdc" / "volumes").is_dir():
        pytest.skip("no ACDC volumes")
    dm, held, _ = evidence.build_data(args("acdc"))
    pats = [{c.rsplit("_", 1)[0] for c in d.case_ids()} for d in (dm.train_dataset, dm.val_dataset, held["acdc_test"])]
    assert [len(p) for p in pats] == [4, 3, 3]
    assert not (pats[0] & pats[1] or pats[0] & pats[2] or pats[1] & pats[2])
    assert len(held["acdc_test"].case_ids()) == 6  # ED and ES of each held-out patient
