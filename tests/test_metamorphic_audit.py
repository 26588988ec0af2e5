"""audit(): the nine default families through the real registry, paper layout, files, both paths."""

import numpy as np
import pandas as pd
import pytest
import torch

from robusttrain.cli.check_output import write_audit
from robusttrain.metamorphic.audit import audit, format_efr_tables
from robusttrain.metamorphic.suite import DEFAULT_PERTURBATIONS, MRSuite


class RedDetector(torch.nn.Module):
    """Foreground where the red channel is bright: a fixed, colour-fragile 'model'."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(40.0))

    def forward(self, x):
        fg = self.w * (x[:, :1] - 0.5)
        return torch.cat([-fg, fg], 1)


def _data(n=4, size=64, c=3):  # text overlay needs >= 64 px (48 px crashes its numpy path)
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        img = torch.randint(40, 90, (c, size, size), generator=g).float() / 255
        m = torch.zeros(size, size, dtype=torch.long)
        r = 8 + 3 * i
        img[:, 10 : 10 + r, 12 : 12 + r] = torch.tensor([200, 110, 90][:c]).view(c, 1, 1) / 255
        m[10 : 10 + r, 12 : 12 + r] = 1
        out.append({"image": img, "mask": m, "case_id": f"c{i}", "slice_index": 0})
    return out


def test_audit_default_suite_paper_layout_and_files(tmp_path):
    res = audit(RedDetector(), {"kvasir": _data(), "etis": _data(3)}, MRSuite(seed=0))
    write_audit(tmp_path, res)  # what `robusttrain check` writes
    t25 = res["tables"][0.25]
    per = ["Dice", "IoU", "perturbed Dice", "worst family", "worst family Dice"]
    assert list(t25.columns) == ["held out"] + [f"{d}/{c}" for d in ("kvasir", "etis") for c in per]
    assert list(t25.index) == list(DEFAULT_PERTURBATIONS) + ["all", "clean"]
    assert t25.loc["clean", "kvasir/Dice"] == 100.0  # the detector is perfect on clean data
    rates = [f"{d}/{m}" for d in ("kvasir", "etis") for m in ("Dice", "IoU")]
    assert (res["tables"][0.5].drop("clean")[rates] <= t25.drop("clean")[rates]).all().all()  # stricter t
    # beside each rate the mean perturbed Dice, by hand from the per-test-case rows
    kv = res["cases"].iloc[: 4 * 9 * 2]  # the kvasir cases come first
    by_family = kv.groupby("perturbation").fol_dice.mean()
    assert t25.loc["blur", "kvasir/perturbed Dice"] == pytest.approx(100 * by_family["blur"], abs=0.005)
    assert t25.loc["all", "kvasir/perturbed Dice"] == pytest.approx(100 * kv.fol_dice.mean(), abs=0.005)
    assert t25.loc["all", "kvasir/worst family"] == by_family.idxmin()
    assert t25.loc["all", "kvasir/worst family Dice"] == pytest.approx(100 * by_family.min(), abs=0.005)
    assert t25.loc["clean", "kvasir/perturbed Dice"] == 100.0  # the clean row: the clean Dice
    assert set(t25["held out"]) == {""}  # nothing held out
    assert 0 < t25.loc["all", "kvasir/Dice"] < 100
    csv = pd.read_csv(tmp_path / "efr_table.csv")
    assert set(csv.threshold) == {0.25, 0.5} and "kvasir/IoU" in csv.columns
    md = (tmp_path / "efr_table.md").read_text()
    # the tables, then what the project's evidence says of the families (the test below)
    assert md.startswith(format_efr_tables(res["tables"], res["n_cases"])) and "### EFR (%) at t = 0.5" in md
    assert res["n_cases"] == {"kvasir": 4, "etis": 3}  # each table says what it rests on
    assert md.count("Rests on 4 case(s) of kvasir, 3 case(s) of etis.") == 2
    assert len(res["cases"]) == (4 + 3) * 9 * 2


def test_audit_paths_agree_on_every_family():
    data = _data(3)
    out = {
        p: audit(RedDetector(), {"val": data}, MRSuite(seed=2), path=p)["cases"] for p in ("torch", "numpy")
    }
    t, n = out["torch"], out["numpy"]
    assert (t.drop_dice > 0.25).tolist() == (n.drop_dice > 0.25).tolist()
    assert np.allclose(t.fol_dice, n.fol_dice, atol=0.03)


def test_one_channel_data_skips_rgb_only_families():
    one = [{"image": d["image"][:1], "mask": d["mask"]} for d in _data(2)]
    suite = MRSuite(seed=0)
    res = audit(RedDetector(), {"cxr": one}, suite)
    assert suite.skipped and set(suite.skipped) <= set(DEFAULT_PERTURBATIONS)
    assert set(res["cases"].perturbation) == {n for n, _ in suite.tests}


def test_heldout_families_are_added_tested_labelled_and_pooled():
    res = audit(
        RedDetector(), {"val": _data(3)}, MRSuite(["contrast"], (2,), seed=0), heldout=["white_balance"]
    )
    assert set(res["cases"].perturbation) == {"contrast", "white_balance"}  # added to the suite
    efr = res["efr"]
    assert (
        efr[efr.perturbation == "white_balance"].heldout.all()
        and not efr[efr.perturbation != "white_balance"].heldout.any()
    )
    t = res["tables"][0.25]
    assert list(t.index) == [
        "contrast",
        "white_balance",
        "held-out families",
        "trained families",
        "all",
        "clean",
    ]
    assert t.loc["white_balance", "held out"] == "yes" and t.loc["contrast", "held out"] == ""
    wb = res["cases"][res["cases"].perturbation == "white_balance"]
    assert t.loc["held-out families", "val/perturbed Dice"] == pytest.approx(
        100 * wb.fol_dice.mean(), abs=0.005
    )
    assert t.loc["held-out families", "val/worst family"] == "white_balance"
    assert t.loc["held-out families", "val/Dice"] == pytest.approx(
        100 * (wb.drop_dice > 0.25).mean(), abs=0.005
    )
    md = format_efr_tables(res["tables"])
    assert "| white_balance | yes |" in md and "| held-out families | yes |" in md


def test_an_unknown_heldout_family_is_one_line():
    with pytest.raises(ValueError, match=r"^heldout: unknown perturbation 'nope'; valid families: ") as err:
        audit(RedDetector(), {"val": _data(2)}, MRSuite(["contrast"], (2,)), heldout=["contrast", "nope"])
    assert "\n" not in str(err.value)


def test_the_tables_say_which_families_tracked_a_new_centre_in_the_project_s_evidence(tmp_path):
    """efr_table.md ends with what the evidence says each tested family's number is worth for a new centre
    (robusttrain/metamorphic/family_validity.json): the families whose interval lies above 0 are named as
    tracking, the others as not -- read from the package's table, never typed here."""
    from robusttrain.metamorphic.validity import family_validity

    fams = family_validity()["families"]
    tracked = min(f for f, d in fams.items() if d["lo"] > 0)
    untracked = min(f for f, d in fams.items() if d["lo"] <= 0)
    write_audit(
        tmp_path, audit(RedDetector(), {"val": _data(2)}, MRSuite([tracked, untracked], (2,), seed=0))
    )
    md = (tmp_path / "efr_table.md").read_text()
    note = md.split("tracked a new hospital in the project's evidence", 1)[1]
    said, rest = note.split("(interval above 0)", 1)  # the first view: every run, recipes pooled
    assert tracked in said and untracked not in said and untracked in rest.split("did not")[0]
    assert "not a guarantee" in note
