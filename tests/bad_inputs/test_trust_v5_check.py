"""Issue 48 ("The first hour", items 3 and 8) and issue 46 ("Trust v5", findings 3 and 11): what ``check``
writes and says. Each test failed on the code before (named in its docstring); the CLI runs in-process,
with exit code, exactly one ``robusttrain <command>: error:`` line when it is not 0, and no traceback.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest

from robusttrain.cli import main

from .test_cli import TINY
from .test_trust_v4 import _run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One 1-epoch smoke run: metamorphic training drew blur and contrast (the suite's families)."""
    run = tmp_path_factory.mktemp("trust_v5_check") / "run"
    assert main(["fit", *TINY, f"run_dir={run}", "trainer.max_epochs=1"]) == 0
    stats = pd.read_csv(run / "metamorphic_training.csv")
    assert set(stats.loc[stats["chosen"] > 0, "family"]) == {"blur", "contrast"}
    return run


def _copy(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def _table(folder: Path, t: float = 0.25) -> pd.DataFrame:
    table = pd.read_csv(folder / "efr_table.csv", keep_default_na=False)
    return table[table["threshold"] == t].set_index("perturbation")


# --- 48 item 3: check and report meet ------------------------------------------------------------------
def test_check_of_a_runs_checkpoint_writes_into_the_run_and_one_report_shows_both(trained, tmp_path, capsys):
    """``check ckpt=RUN/checkpoints/last.ckpt heldout=motion_blur`` wrote a new run directory, so ``report
    RUN`` never showed the held-out families (before: no RUN/checks/, the report had no check section). Now
    the tables go to RUN/checks/last-val/ (every name on the run directory's list) and one report of RUN
    shows the training side and the check; a check-only directory reports as a check, not as "config.yaml
    missing"."""
    from robusttrain.rundir import layout

    run = _copy(trained, tmp_path)
    out, _ = _run(["check", *TINY, f"ckpt={run}/checkpoints/last.ckpt", "heldout=motion_blur"], capsys)
    folder = run / "checks" / "last-val"
    assert f"writing into the training run {run}" in out
    for name in ("efr_table.csv", "efr_table.md", "check.json", "check_cases.csv", "check_followups.csv"):
        assert (folder / name).is_file(), name
    assert not (run / "efr_table.csv").exists()  # the run's own EFR table (efr.csv) stays the report's
    assert _table(folder).loc["motion_blur", "held out"] == "yes"
    assert json.loads((folder / "check.json").read_text())["ckpt"] == str(run / "checkpoints" / "last.ckpt")
    _run(["report", str(run)], capsys)
    html = (run / "report.html").read_text()
    checks = html.split('<section id="checks">', 1)[1].split("</section>", 1)[0]
    assert "last-val" in checks and "motion_blur" in checks and "held-out families" in checks
    # and what the project's evidence says the checked families' numbers are worth for a new centre
    assert "tracked a new hospital in the project&#39;s evidence" in checks and "not a guarantee" in checks
    assert '<section id="training">' in html and "not available: history.csv missing" not in html
    assert layout.unknown_files(run) == []
    # run_dir= naming the training run does the same, under name=
    _run(["check", *TINY, f"ckpt={run}/checkpoints/last.ckpt", f"run_dir={run}", "name=again"], capsys)
    assert (run / "checks" / "again" / "efr_table.csv").is_file()
    # a check-only run directory says what it is
    alone = tmp_path / "alone"
    _run(["check", *TINY, f"ckpt={run}/checkpoints/last.ckpt", f"run_dir={alone}"], capsys)
    _run(["report", str(alone)], capsys)
    page = (alone / "report.html").read_text()
    assert "config.yaml missing" not in page and "robusttrain check</code> of" in page
    assert layout.unknown_files(alone) == []


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["name=../x"], "bad value for 'name': '../x' (expected a folder name"),
        (["name=x", "run_dir={tmp}/elsewhere"], "name= names the check's folder inside a training run"),
    ],
)
def test_check_name_is_a_folder_name_inside_a_training_run(trained, tmp_path, capsys, argv, text):
    """``name=`` is new: a path, or a name for a run_dir that is not a training run, is one line."""
    run = _copy(trained, tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    _run(["check", *TINY, f"ckpt={run}/checkpoints/last.ckpt", *argv], capsys, code=2, text=text)
    assert not (run / "checks").exists() and not (tmp_path / "elsewhere").exists()


def test_report_refuses_a_torn_check_summary_in_one_line(trained, tmp_path, capsys):
    """A run directory is untrusted: a ``checks/<name>/check.json`` that is not JSON is one line naming it."""
    run = _copy(trained, tmp_path)
    (run / "checks" / "x").mkdir(parents=True)
    (run / "checks" / "x" / "check.json").write_text('{"ckpt": ')
    _run(["report", str(run)], capsys, code=2, text="check.json' is not JSON")


def test_help_lists_every_key_a_user_needs(capsys):
    """``check --help`` printed the general usage, naming neither ``heldout=`` nor ``run_dir=``."""
    out, _ = _run(["check", "--help"], capsys)
    for key in ("ckpt=", "heldout=", "run_dir=", "data.root=", "split=", "name=", "recipe=", "model="):
        assert key in out, key
    out, _ = _run(["fit", "--help"], capsys)
    for key in (
        "recipe=",
        "data.root=",
        "run_dir=",
        "ckpt=last",
        "overwrite=true",
        "callbacks.metamorphic.heldout=",
    ):
        assert key in out, key


# --- 48 item 8: per-case scores, empty masks apart -----------------------------------------------------
def _folder(root: Path, lesion: int, empty: int) -> Path:
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(lesion + empty):
        img = rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)
        mask = np.zeros((32, 32), np.uint8)
        if i < lesion:
            mask[8:20, 8:20] = 255
        cv2.imwrite(str(root / "images" / f"f{i}.png"), img)
        cv2.imwrite(str(root / "masks" / f"f{i}.png"), mask)
    return root


def test_check_keeps_per_case_scores_and_scores_empty_masks_apart(trained, tmp_path, capsys):
    """``check data.root=FOLDER`` with 2 frames of 8 without a lesion: before, only the pooled table was
    written, the empty frames were in the Dice means (and "never failed" in the EFR) without a word, the
    whole folder was called ``all`` like the pooled row, and the bar counted forwards. Now: the first line
    of the results counts them, they are kept out of every Dice mean and EFR and scored apart
    (specificity), and per-case / per-follow-up scores are written so two checkpoints pair case by case."""
    run = _copy(trained, tmp_path)
    root = _folder(tmp_path / "data", lesion=6, empty=2)
    common = [*TINY, f"data.root={root}", "callbacks.metamorphic.max_cases=null"]
    out, err = _run(["check", *common, f"ckpt={run}/checkpoints/last.ckpt"], capsys)
    first = next(x for x in out.splitlines() if x.startswith("[robusttrain] check: folder:"))
    assert "folder: 6 cases with a lesion scored; 2 with an empty mask (no lesion) kept out" in first, first
    assert "check folder" in err and "8/8" in err  # the bar counts the 8 images, not their forwards
    folder = run / "checks" / f"last-{root.name}"
    cases = pd.read_csv(folder / "check_cases.csv")
    assert len(cases) == 8 and cases["empty_mask"].sum() == 2
    assert (
        cases.loc[cases["empty_mask"], "dice"].isna().all()
        and cases.loc[~cases["empty_mask"], "dice"].notna().all()
    )
    assert (cases.loc[cases["empty_mask"], "lesion_px"] == 0).all()
    table = _table(folder)
    assert "folder/Dice" in table.columns and "all/Dice" not in table.columns
    clean = float(table.loc["clean", "folder/perturbed Dice"])
    assert clean == pytest.approx(100 * cases.loc[~cases["empty_mask"], "dice"].mean(), abs=0.01)
    fol = pd.read_csv(folder / "check_followups.csv")
    assert (
        len(fol) == 8 * 2 and fol.loc[fol["empty_mask"], "fol_dice"].isna().all()
    )  # 2 tests (blur, contrast)
    empty = pd.read_csv(folder / "check_empty_frames.csv").set_index("perturbation")
    assert empty.loc["clean", "cases"] == 2 and set(empty.index) == {"clean", "blur", "contrast", "all"}
    nothing = int((cases.loc[cases["empty_mask"], "predicted_px"] == 0).sum())
    assert empty.loc["clean", "predicted_nothing"] == nothing
    assert empty.loc["clean", "specificity"] == pytest.approx(nothing / 2)
    assert "Cases whose mask is empty" in (folder / "efr_table.md").read_text()
    assert "Rests on 6 case(s) of folder with a lesion; kept out: 2 of folder with an empty mask" in out
    # a second checkpoint on the same folder pairs with the first, case by case and follow-up by follow-up
    _run(["check", *common, f"ckpt={run}/balanced.ckpt"], capsys)
    other = pd.read_csv(run / "checks" / f"balanced-{root.name}" / "check_followups.csv")
    keys = ["split", "case_id", "perturbation", "severity", "seed"]
    paired = fol.merge(other, on=keys, suffixes=("_last", "_balanced"), validate="one_to_one")
    assert len(paired) == len(fol) == len(other)


# --- 46 finding 3: a family the run trained on is never "held out" -------------------------------------
def test_check_labels_a_family_the_run_trained_on_as_trained(trained, tmp_path, capsys):
    """``check heldout=blur`` on a run whose metamorphic training drew blur labelled blur "held out" and
    pooled it into the held-out row (before: ``| blur | yes |``). Now it is tested, labelled trained, and
    one line says why (the run's records)."""
    run = _copy(trained, tmp_path)
    out, _ = _run(["check", *TINY, f"ckpt={run}/checkpoints/last.ckpt", "heldout=[blur,motion_blur]"], capsys)
    line = next(x for x in out.splitlines() if "reported as a trained family" in x)
    assert "'blur'" in line and "metamorphic_training.csv: " in line and "motion_blur" not in line
    table = _table(run / "checks" / "last-val")
    assert table.loc["blur", "held out"] == "" and table.loc["motion_blur", "held out"] == "yes"
    assert table.loc["held-out families", "val/worst family"] == "motion_blur"
    summary = json.loads((run / "checks" / "last-val" / "check.json").read_text())
    assert summary["heldout"] == ["motion_blur"] and list(summary["trained"]) == ["blur"]
    # written into another training run (run_dir=), what counts as trained is still the checkpoint's run's
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text("seed: 0\n")
    _run(["check", *TINY, f"ckpt={run}/checkpoints/last.ckpt", "heldout=blur", f"run_dir={other}"], capsys)
    assert _table(other / "checks" / "last-val").loc["blur", "held out"] == ""


def test_resume_that_adds_heldout_is_refused_by_the_cli_in_one_line(tmp_path, capsys):
    """``fit ... ckpt=last callbacks.metamorphic.heldout=[blur]`` after an epoch that trained on blur: a
    resume may not change the training settings (issue 43's resume guard), so the CLI refuses in one line
    naming the key, before any epoch, and efr.csv keeps only epoch 0."""
    run = tmp_path / "run"
    assert main(["fit", *TINY, f"run_dir={run}", "trainer.max_epochs=1"]) == 0
    before = (run / "efr.csv").read_text()
    capsys.readouterr()
    code = main(
        [
            "fit",
            *TINY,
            f"run_dir={run}",
            "ckpt=last",
            "trainer.max_epochs=2",
            "callbacks.metamorphic.heldout=[blur]",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "callbacks.metamorphic.heldout" in lines[0], err[-2000:]
    assert "Traceback" not in err
    assert (run / "efr.csv").read_text() == before


def test_a_library_resume_that_adds_heldout_does_not_call_a_trained_family_held_out(tmp_path):
    """A Lightning user resuming with ``MetamorphicCallback(heldout=["blur"])`` after an epoch whose
    MetamorphicTraining drew blur: efr.csv said blur was not held out at epoch 0 and held out at epoch 1
    (before). The callback applies the same rule as check: trained on is never held out, said in one
    warning."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader
    from toys import Blobs, Tiny, quiet_trainer

    from robusttrain.callbacks import MetamorphicCallback, MetamorphicTraining, RobustnessContext
    from robusttrain.metamorphic.suite import MRSuite

    def fit(epochs, heldout=None, ckpt=None):
        ds, ctx = Blobs(n=8), RobustnessContext()
        callbacks = [
            MetamorphicTraining(perturbations=["blur", "contrast"], k=1, q=1.0, dirpath=tmp_path, context=ctx),
            MetamorphicCallback(
                suite=MRSuite(["blur", "contrast"], (2,), seed=5), heldout=heldout, dirpath=tmp_path,
                verbose=False, context=ctx,
            ),
            ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True),
        ]  # fmt: skip
        trainer = quiet_trainer(
            max_epochs=epochs, callbacks=callbacks, deterministic=True, enable_checkpointing=True
        )
        trainer.fit(Tiny(lr=0.5), DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4), ckpt_path=ckpt)

    fit(1)
    stats = pd.read_csv(tmp_path / "metamorphic_training.csv")
    assert stats.loc[stats["family"] == "blur", "chosen"].sum() > 0  # epoch 0 trained on blur
    with pytest.warns(UserWarning, match="'blur' is reported as a trained family"):
        fit(2, heldout=["blur"], ckpt=tmp_path / "checkpoints" / "last.ckpt")
    efr = pd.read_csv(tmp_path / "efr.csv")
    blur = efr[efr["perturbation"] == "blur"]
    assert sorted(set(blur["epoch"])) == [0, 1]
    assert not blur["heldout"].astype(bool).any(), blur[["epoch", "heldout"]]


# --- 46 finding 11: heldout=adversarial ----------------------------------------------------------------
def test_check_heldout_adversarial_attacks_the_checkpoint(trained, tmp_path, capsys):
    """``check heldout=adversarial`` was a raw ValueError ("adversarial: needs the model"); the check has
    the model, so the family now runs against it (FGSM on the checkpoint) and is labelled held out."""
    run = _copy(trained, tmp_path)
    _run(["check", *TINY, f"ckpt={run}/checkpoints/last.ckpt", "heldout=adversarial", "name=adv"], capsys)
    table = _table(run / "checks" / "adv")
    assert table.loc["adversarial", "held out"] == "yes"
    assert 0 <= float(table.loc["adversarial", "val/perturbed Dice"]) <= 100
    fol = pd.read_csv(run / "checks" / "adv" / "check_followups.csv")
    assert (fol["perturbation"] == "adversarial").sum() == 4  # 4 cases x severity 4


def test_the_training_time_check_refuses_adversarial_in_one_line(tmp_path, capsys):
    """``fit … callbacks.metamorphic.heldout=[adversarial]`` was a raw ValueError ("needs the model") after
    config.yaml and logs/ were written. The training-time check replays each case's perturbation every
    epoch, so an attack on one epoch's weights cannot be scored as adversarial to the next: it is refused
    when the callback is built, in one line pointing to ``check … heldout=adversarial``; nothing is written."""
    run = tmp_path / "run"
    _run(
        [
            "fit",
            *TINY,
            f"run_dir={run}",
            "trainer.max_epochs=1",
            "callbacks.metamorphic.heldout=[adversarial]",
        ],
        capsys,
        code=2,
        text="'adversarial' attacks fixed weights; the training-time check replays",
    )
    assert not run.exists() or not any(run.iterdir())
