"""What a demanding user tries on the command line, each with its exact outcome (issue 10).

Every scenario runs the CLI in-process (``robusttrain.cli.main``) and asserts either

* exit code 2 and exactly one ``robusttrain <command>: error: ...`` line on stderr containing the
  expected text (the file / key / value it names), no traceback, or
* exit code 0 and the correct result (checked by the scenario's ``then``).

The runs use the ``smoke`` recipe made tinier still; one trained run directory is shared (each
scenario that writes into it gets its own copy).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from robusttrain.cli import main

TINY = [
    "recipe=smoke",
    "data.n_train=8",
    "data.n_val=4",
    "data.image_size=32",
    "data.batch_size=4",
    "callbacks.metamorphic.max_cases=4",
    "callbacks.mining.train_probe_size=4",
    "callbacks.metamorphic.suite.perturbations=[blur,contrast]",
    "trainer.enable_progress_bar=false",
]
SECRET = b"\x89PNG\r\n\x1a\nTOP-SECRET-NOT-IN-THE-RUN-DIR"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One 1-epoch smoke run (checkpoints, logs, robustness files), trained once for the module."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["fit", *TINY, f"run_dir={run}", "trainer.max_epochs=1"]) == 0
    assert (run / "checkpoints" / "last.ckpt").is_file() and (run / "logs" / "metrics.csv").is_file()
    return run


@dataclass
class S:
    """One scenario: ``argv`` (``{run}``, ``{tmp}``, ``{ckpt}`` filled in), the exit code and
    the text of the one error line (code 2) or a check of the result (code 0)."""

    id: str
    argv: list[str]
    code: int = 2
    text: str | None = None
    prep: Callable[[SimpleNamespace], None] | None = None
    then: Callable[[SimpleNamespace, str, str], None] | None = None
    marks: list = field(default_factory=list)


def _bad_ckpt(name: str, data: bytes | Callable[[SimpleNamespace], bytes]):
    def prep(c):
        (c.tmp / name).write_bytes(data(c) if callable(data) else data)

    return prep


def _names_the_file_s_model(c, out: str, err: str) -> None:
    """The refusal ends with the model settings the checkpoint was written with, as overrides."""
    line = err.strip().splitlines()[-1]
    assert "; the file was written with model=basic_unet model.features=[8,8,16,16,32,8]" in line, line


def _pickle_payload(c) -> None:
    """A checkpoint whose unpickling would create ``pwned`` (proof that code ran)."""

    class Payload:
        def __reduce__(self):
            return (open, (str(c.tmp / "pwned"), "w"))

    ckpt = torch.load(c.ckpt, weights_only=True)
    ckpt["hyper_parameters"] = {"x": Payload()}
    torch.save(ckpt, c.tmp / "evil.ckpt")


PLAIN_RECIPE = """defaults:
  - data: polyp
  - trainer: default
  - callbacks: robust
  - logger: csv
  - _self_
recipe: plain
seed: 0
run_dir: null
ckpt: null
data: {image_size: 32, batch_size: 4, n_train: 8, n_val: 4}
model: {_target_: torch.nn.Conv2d, in_channels: 3, out_channels: 2, kernel_size: 1}
callbacks:
  metamorphic: {max_cases: 4, suite: {perturbations: [blur], severities: [4]}}
"""


def _plain_module_payload(c) -> None:
    """A user recipe whose model is a plain nn.Module (the path that used torch.load(weights_only=False)),
    and a checkpoint for it carrying a pickle payload."""
    (c.tmp / "recipes").mkdir(exist_ok=True)
    (c.tmp / "recipes" / "plain.yaml").write_text(PLAIN_RECIPE)

    class Payload:
        def __reduce__(self):
            return (open, (str(c.tmp / "pwned"), "w"))

    torch.save({"state_dict": torch.nn.Conv2d(3, 2, 1).state_dict(), "x": Payload()}, c.tmp / "evil.ckpt")


def _not_pwned(c, out, err):
    assert not (c.tmp / "pwned").exists(), "the checkpoint's pickle ran code"


def _other_recipe_ckpt(c) -> None:
    ckpt = torch.load(c.ckpt, weights_only=True)
    k = next(k for k in ckpt["state_dict"] if k.endswith("weight"))
    ckpt["state_dict"][k] = torch.zeros(3, 3)
    torch.save(ckpt, c.tmp / "other.ckpt")


def _report_with_paths(*paths: Callable[[SimpleNamespace], str]):
    """A run whose failures.jsonl names files outside the run directory as thumbnails."""

    def prep(c):
        (c.tmp / "secret.png").write_bytes(SECRET)
        log = c.run / "failures" / "failures.jsonl"
        log.parent.mkdir(exist_ok=True)
        recs = [
            {
                "kind": "failure",
                "id": f"x{i}",
                "case_id": "c",
                "perturbation": "blur",
                "severity": 4,
                "epoch": 0,
                "split": "train",
                "src_dice": 0.9,
                "fol_dice": 0.1,
                "drop": 0.9,
                "thumb": p(c),
                "extra": {"thumb": p(c)},
            }
            for i, p in enumerate(paths)
        ]
        log.write_text(
            "".join(json.dumps(r) + "\n" for r in recs)
            + json.dumps({"kind": "batch", "epoch": 0, "seen": [], "n": len(recs)})
            + "\n"
        )

    return prep


def _secret_not_embedded(c, out, err):
    html = (c.run / "report.html").read_text()
    assert base64.b64encode(SECRET).decode() not in html
    assert "TOP-SECRET" not in html
    assert '<section id="failures">' in html  # the report itself was written


def _symlinked_thumb(c):
    (c.tmp / "secret.png").write_bytes(SECRET)
    _report_with_paths(lambda c: "failures/thumbs/x0.png")(c)
    (c.run / "failures" / "thumbs").mkdir(parents=True, exist_ok=True)
    (c.run / "failures" / "thumbs" / "x0.png").symlink_to(c.tmp / "secret.png")


def _unchanged(*names: str):
    """``then``: the training run's files are byte-identical after the command."""

    def then(c, out, err):
        for n in names:
            assert (c.run / n).read_bytes() == c.before[n], f"{n} was modified"

    return then


def _also(*checks):
    def then(c, out, err):
        for f in checks:
            f(c, out, err)

    return then


def _heldout_labelled(c, out):
    """``check heldout=motion_blur``: the family is tested and marked held out in the printed table
    and checks/last-val/efr_table.csv, pooled on its own, beside the perturbed Dice."""
    import pandas as pd

    assert "| motion_blur | yes |" in out and "| held-out families | yes |" in out, out[-3000:]
    table = pd.read_csv(c.run / "checks" / "last-val" / "efr_table.csv", keep_default_na=False)
    rows = table[table.threshold == 0.25].set_index("perturbation")
    assert rows.loc["motion_blur", "held out"] == "yes" and rows.loc["blur", "held out"] == ""
    assert rows.loc["held-out families", "val/worst family"] == "motion_blur"
    assert 0 <= float(rows.loc["motion_blur", "val/perturbed Dice"]) <= 100


def _exists(*names: str):
    def then(c, out, err):
        for n in names:
            assert (c.run / n).exists(), n

    return then


def _leftover_tmps(c):
    (c.run / ".history.csv.abc123de.robusttrain.tmp").write_text("half")
    (c.run / "checkpoints" / ".last.ckpt.xyz123ab.robusttrain.tmp").write_bytes(b"half")


def _no_tmps_no_lock(c, out, err):
    assert not list(c.run.rglob(".*.tmp")), list(c.run.rglob(".*.tmp"))
    assert not (c.run / ".robusttrain.lock").exists()


def _nothing_trained(c, out, err):
    fresh = c.tmp / "fresh"
    assert not (fresh / "checkpoints").exists() and not (fresh / "config.yaml").exists()
    assert not (fresh / ".robusttrain.lock").exists()


def _metrics_epochs(expected: list[int]):
    def then(c, out, err):
        import pandas as pd

        m = pd.read_csv(c.run / "logs" / "metrics.csv")
        assert sorted(set(m["epoch"])) == expected
        val = m.dropna(subset=["val/dice"])
        assert list(val["epoch"]) == expected  # one validation row per epoch: nothing lost, nothing twice

    return then


RUN = "run_dir={run}"
FRESH = "run_dir={tmp}/fresh"
CK = "ckpt={ckpt}"

# a broken checkpoint: (file name, its bytes, or None for another recipe's weights; the error line's text)
BROKEN_CKPT = {
    "empty-ckpt": ("empty.ckpt", b"", "empty.ckpt' is empty (0 bytes"),
    "truncated-ckpt": (
        "trunc.ckpt",
        lambda c: c.ckpt.read_bytes()[:50000],
        "trunc.ckpt' is truncated or corrupt",
    ),
    "random-bytes": ("rand.ckpt", b"\x00garbage" * 100, "rand.ckpt' is not a PyTorch checkpoint"),
    "other-recipe": ("other.ckpt", None, "other.ckpt' does not fit SegmentationModule: shape of"),
}


def _broken_ckpt(command: str, kind: str) -> S:
    name, data, text = BROKEN_CKPT[kind]
    prep = _other_recipe_ckpt if data is None else _bad_ckpt(name, data)
    return S(f"{command}-{kind}", [command, *TINY, RUN, f"ckpt={{tmp}}/{name}"], text=text, prep=prep)


SCENARIOS = [
    # --- security -----------------------------------------------------------------------------
    S(
        "check-pickle-payload",
        ["check", *TINY, RUN, "ckpt={tmp}/evil.ckpt"],
        text="evil.ckpt' holds Python objects besides weights and was refused",
        prep=_pickle_payload,
        then=_not_pwned,
    ),
    S(
        "check-plain-module-pickle-payload",
        ["check", "recipe=plain", RUN, "ckpt={tmp}/evil.ckpt"],
        text="evil.ckpt' holds Python objects besides weights and was refused",
        prep=_plain_module_payload,
        then=_not_pwned,
    ),
    S(
        "validate-pickle-payload",
        ["validate", *TINY, RUN, "ckpt={tmp}/evil.ckpt"],
        text="was refused",
        prep=_pickle_payload,
        then=_not_pwned,
    ),
    S(
        "fit-resume-pickle-payload",
        ["fit", *TINY, RUN, "ckpt={tmp}/evil.ckpt"],
        text="was refused",
        prep=_pickle_payload,
        then=_not_pwned,
    ),
    S(
        "report-absolute-thumb-outside",
        ["report", "{run}"],
        code=0,
        prep=_report_with_paths(lambda c: str(c.tmp / "secret.png")),
        then=_secret_not_embedded,
    ),
    S(
        "report-relative-thumb-outside",
        ["report", "{run}"],
        code=0,
        prep=_report_with_paths(lambda c: "../secret.png", lambda c: os.path.relpath(c.tmp / "secret.png")),
        then=_secret_not_embedded,
    ),
    S(
        "report-symlinked-thumb",
        ["report", "{run}"],
        code=0,
        prep=_symlinked_thumb,
        then=_secret_not_embedded,
    ),
    S(
        "group-path-traversal",
        ["fit", *TINY, "data=../../../x"],
        text="unknown data '../../../x'; valid choices: acdc, cxr, polyp",
    ),
    S(
        "group-path-traversal-nested",
        ["fit", *TINY, "data=polyp/../../x"],
        text="unknown data 'polyp/../../x'",
    ),
    S("group-key-traversal", ["fit", *TINY, "+data/../..=x"], text="unknown config group 'data/../..'"),
    S("logger-traversal", ["validate", *TINY, "logger=../../../etc/x", CK], text="unknown logger"),
    S(
        "hydra-searchpath",
        ["fit", *TINY, "hydra.searchpath=[file:///tmp]"],
        text="'hydra.searchpath' cannot be set on the command line",
    ),
    # --- silent wrong results -----------------------------------------------------------------
    S(
        "max-epochs-minus-one",
        ["fit", *TINY, RUN, "trainer.max_epochs=-1"],
        text="trainer.max_epochs=-1 would train without an end",
    ),
    S("max-epochs-null", ["fit", *TINY, RUN, "trainer.max_epochs=null"], text="trainer.max_epochs=null"),
    S(
        "max-epochs-zero",
        ["fit", *TINY, RUN, "trainer.max_epochs=0"],
        text="bad value for 'trainer.max_epochs': 0 (expected a positive integer",
    ),
    # --- data loss ----------------------------------------------------------------------------
    S(
        "fit-resume-keeps-metrics",
        ["fit", *TINY, RUN, "ckpt=last", "trainer.max_epochs=2"],
        code=0,
        then=_metrics_epochs([0, 1]),
    ),
    S(
        "validate-beside-run",
        ["validate", *TINY, RUN, "ckpt=last"],
        code=0,
        then=_also(
            _unchanged("config.yaml", "logs/metrics.csv", "history.csv"),
            _exists("config.validate.yaml", "logs/validate/metrics.csv"),
        ),
    ),
    S(
        "test-beside-run",
        ["test", *TINY, RUN, "ckpt=last"],
        code=0,
        then=_also(_unchanged("config.yaml", "logs/metrics.csv"), _exists("config.test.yaml")),
    ),
    S(
        "check-beside-run",
        ["check", *TINY, RUN, CK],
        code=0,
        then=_also(
            _unchanged("config.yaml", "logs/metrics.csv", "history.csv", "efr.csv"),
            # a check of the run's own checkpoint goes beside its training files (issue 48)
            _exists("checks/last-val/config.check.yaml", "checks/last-val/efr_table.csv"),
        ),
    ),
    S(
        "check-heldout-unknown-family",
        ["check", *TINY, RUN, CK, "heldout=[motion_blur,nope]"],
        text="bad value for 'heldout': unknown perturbation 'nope'; valid families: ",
        then=_unchanged("config.yaml", "efr.csv"),
    ),
    S(
        "check-heldout-labelled",
        ["check", *TINY, RUN, CK, "heldout=motion_blur"],
        code=0,
        then=_also(_unchanged("efr.csv"), lambda c, o, e: _heldout_labelled(c, o)),
    ),
    S(
        "leftover-tmp-files-removed",
        ["validate", *TINY, RUN, "ckpt=last"],
        code=0,
        prep=_leftover_tmps,
        then=_also(_no_tmps_no_lock, lambda c, o, e: "removed 2 temporary file(s)" in e or pytest.fail(e)),
    ),
    S(
        "lock-released-after-error",
        ["validate", *TINY, RUN, "ckpt={tmp}/empty.ckpt"],
        text="is empty",
        prep=_bad_ckpt("empty.ckpt", b""),
        then=_no_tmps_no_lock,
    ),
    # --- broken checkpoints: one line naming the file ---------------------------------------
    *(
        _broken_ckpt(command, kind)
        for command in ("validate", "check", "test")
        for kind in BROKEN_CKPT
        if (command, kind) != ("validate", "random-bytes")  # validate gets os.urandom bytes (below)
    ),
    S(
        "validate-random-bytes",
        ["validate", *TINY, RUN, "ckpt={tmp}/rand.ckpt"],
        text="rand.ckpt' is not a PyTorch checkpoint",
        prep=_bad_ckpt("rand.ckpt", os.urandom(4096).replace(b"PK", b"pk")),
    ),
    S(
        "validate-other-model",
        ["validate", *TINY, RUN, CK, "model=attention_unet"],
        text="does not fit SegmentationModule: ",
    ),
    S(
        "validate-not-lightning",
        ["validate", *TINY, RUN, "ckpt={tmp}/plain.ckpt"],
        text="plain.ckpt' is not a Lightning checkpoint",
        prep=lambda c: torch.save({"w": torch.ones(1)}, c.tmp / "plain.ckpt"),
    ),
    S(
        "validate-ckpt-is-directory",
        ["validate", *TINY, RUN, "ckpt={tmp}"],
        text="is a directory, not a file",
    ),
    S(
        "validate-ckpt-missing",
        ["validate", *TINY, RUN, "ckpt={tmp}/nope.ckpt"],
        text="checkpoint not found: ckpt={tmp}/nope.ckpt",
    ),
    S(
        "validate-ckpt-last-none-saved",
        ["validate", *TINY, "run_dir={tmp}/fresh", "ckpt=last"],
        text="checkpoint not found: ckpt=last",
    ),
    S(
        "fit-resume-truncated",
        ["fit", *TINY, RUN, "ckpt={tmp}/trunc.ckpt"],
        text="trunc.ckpt' is truncated",
        prep=_bad_ckpt("trunc.ckpt", lambda c: c.ckpt.read_bytes()[:-1000]),
    ),
    S(
        "fit-resume-last-empty",
        ["fit", *TINY, RUN, "ckpt=last"],
        text="last.ckpt' is empty",
        prep=lambda c: (c.run / "checkpoints" / "last.ckpt").write_bytes(b""),
    ),
    S("check-missing-ckpt", ["check", *TINY, RUN], text="check needs ckpt=PATH"),
    S(
        "test-pickle-payload",
        ["test", *TINY, RUN, "ckpt={tmp}/evil.ckpt"],
        text="was refused",
        prep=_pickle_payload,
        then=_not_pwned,
    ),
    S(
        "fit-resume-random-bytes",
        ["fit", *TINY, RUN, "ckpt={tmp}/rand.ckpt"],
        text="rand.ckpt' is not a PyTorch checkpoint",
        prep=_bad_ckpt("rand.ckpt", b"\x00garbage" * 100),
        then=_unchanged("history.csv", "logs/metrics.csv"),
    ),
    S(
        "fit-resume-other-recipe",
        ["fit", *TINY, RUN, "ckpt={tmp}/other.ckpt"],
        text="does not fit SegmentationModule",
        prep=_other_recipe_ckpt,
        then=_unchanged("history.csv", "logs/metrics.csv"),
    ),
    # --- output paths -------------------------------------------------------------------------
    S("gallery-out-directory", ["gallery", *TINY[:1], "out={tmp}"], text="bad value for 'out'"),
    S(
        "gallery-out-wrong-suffix",
        ["gallery", *TINY[:1], "out={tmp}/g.jpg"],
        text="(expected a file path ending in .png)",
    ),
    S(
        "gallery-out-parent-is-file",
        ["gallery", *TINY[:1], "out={tmp}/f.txt/g.png"],
        text="is a file, not a folder",
        prep=lambda c: (c.tmp / "f.txt").write_text("x"),
    ),
    S("gallery-n-zero", ["gallery", *TINY[:1], "n=0"], text="bad value for 'n': '0'"),
    S("report-out-directory", ["report", "{run}", "out={tmp}"], text="is a directory"),
    S("report-out-wrong-suffix", ["report", "{run}", "out={tmp}/r.pdf"], text="ending in .html"),
    S("report-missing-run", ["report", "{tmp}/nope"], text="run directory not found"),
    S(
        "run-dir-is-a-file",
        ["fit", *TINY, "run_dir={tmp}/f.txt"],
        text="cannot create run_dir",
        prep=lambda c: (c.tmp / "f.txt").write_text("x"),
    ),
    # --- bad config values: fail before training, one line naming the key --------------------
    S(
        "unknown-perturbation",
        ["fit", *TINY, RUN, "callbacks.metamorphic.suite.perturbations=[blur,nope]"],
        text="bad value for 'callbacks.metamorphic.suite.perturbations' (['blur', 'nope']): unknown perturbation 'nope'",
    ),
    S(
        "severity-6",
        ["fit", *TINY, FRESH, "callbacks.metamorphic.suite.severities=[6]"],
        text="bad value for 'callbacks.metamorphic.suite.severities' ([6]): ",
        then=_nothing_trained,
    ),
    S(
        "severity-0",
        ["fit", *TINY, FRESH, "callbacks.metamorphic.suite.severities=[0]"],
        text="bad value for 'callbacks.metamorphic.suite.severities' ([0]): ",
        then=_nothing_trained,
    ),
    S(
        "contamination-0.9",
        ["fit", *TINY, FRESH, "callbacks.balanced.contamination=0.9"],
        text="bad value for 'callbacks.balanced.contamination' (0.9): ",
        then=_nothing_trained,
    ),
    S(
        "replay-ratio-1",
        ["fit", *TINY, FRESH, "callbacks.mining.replay_ratio=1.0"],
        text="bad value for 'callbacks.mining.replay_ratio' (1.0): ",
        then=_nothing_trained,
    ),
    S(
        "mining-mode-unknown",
        ["fit", *TINY, FRESH, "callbacks.mining.mode=frozen"],
        text="bad value for 'callbacks.mining.mode' ('frozen'): mode='frozen': expected one of 'steer', 'replay'",
        then=_nothing_trained,
    ),
    S(
        "mining-steer-2",
        ["fit", *TINY, FRESH, "callbacks.mining.steer=2"],
        text="bad value for 'callbacks.mining.steer' (2): ",
        then=_nothing_trained,
    ),
    S(
        "image-size-0",
        ["fit", *TINY, FRESH, "data.image_size=0"],
        text="bad value for 'data.image_size' (0): ",
        then=_nothing_trained,
    ),
    S(
        "batch-size-0",
        ["fit", *TINY, FRESH, "data.batch_size=0"],
        text="bad value for 'data.batch_size' (0): ",
        then=_nothing_trained,
    ),
    S(
        "val-fraction-1.5",
        ["fit", *TINY, FRESH, "data.val_fraction=1.5"],
        text="bad value for 'data.val_fraction' (1.5): ",
        then=_nothing_trained,
    ),
    S(
        "every-n-epochs-negative",
        ["fit", *TINY, FRESH, "callbacks.metamorphic.every_n_epochs=-1"],
        text="bad value for 'callbacks.metamorphic.every_n_epochs' (-1): ",
        then=_nothing_trained,
    ),
    S(
        "check-severity-6",
        ["check", *TINY, RUN, CK, "callbacks.metamorphic.suite.severities=[6]"],
        text="bad value for 'callbacks.metamorphic.suite.severities' ([6]): severities=[6]: severity must be an int in 1..5",
    ),
    S(
        "check-unknown-perturbation",
        ["check", *TINY, RUN, CK, "callbacks.metamorphic.suite.perturbations=[nope]"],
        text="bad value for 'callbacks.metamorphic.suite.perturbations'",
    ),
    S(
        "resume-with-changed-suite",
        ["fit", *TINY, RUN, "ckpt=last", "callbacks.metamorphic.suite.severities=[2]"],
        text="cannot resume: the checkpoint's metamorphic suite (perturbations=['blur', 'contrast'] severities=[4]",
        then=_unchanged("history.csv", "efr.csv", "logs/metrics.csv", "config.yaml"),
    ),
    S(
        "replay-ratio-too-high",
        ["fit", *TINY, RUN, "callbacks.mining.replay_ratio=1.0"],
        text="bad value for 'callbacks.mining.replay_ratio' (1.0): replay_ratio=1.0: expected a number in [0, 0.9]",
    ),
    S(
        "contamination-too-high",
        ["fit", *TINY, RUN, "callbacks.balanced.contamination=0.9"],
        text="bad value for 'callbacks.balanced.contamination' (0.9)",
    ),
    S(
        "severity-zero",
        ["fit", *TINY, RUN, "callbacks.metamorphic.suite.severities=[0]"],
        text="bad value for 'callbacks.metamorphic.suite.severities' ([0])",
    ),
    S(
        "corners-contamination-text",
        ["corners", "{run}", "contamination=abc"],
        text="bad value for 'contamination': 'abc'",
    ),
    S("corners-unknown-key", ["corners", "{run}", "nope=1"], text="unknown key 'nope' for corners"),
    S("bad-seed-type", ["fit", *TINY, "seed=abc"], text="bad value for 'seed': 'abc' (expected an integer"),
    S("positional-junk", ["fit", *TINY, "oops"], text="unexpected argument 'oops'"),
    S(
        "model-classes-vs-names",
        ["fit", *TINY, RUN, "model.num_classes=3"],
        text="bad value for 'model.num_classes' (3): model.class_names has 1 names but num_classes=3 needs 2",
    ),
    S(
        "model-classes-vs-data",
        ["fit", *TINY, RUN, "model.num_classes=3", "model.class_names=[a,b]"],
        text="model.num_classes=3 does not match the data",
    ),
    S(
        "check-ckpt-of-another-network",  # the error names the settings the file was written with
        ["check", *TINY, RUN, CK, "model=swin_unetr", "model.features=[12]"],
        text="does not fit SegmentationModule: ",
        then=_names_the_file_s_model,
    ),
    S(
        "model-image-size-vs-network",  # MONAI's own failure was a traceback at the first forward
        ["fit", *TINY, FRESH, "model=swin_unetr", "model.features=[12]", "data.image_size=48"],
        text="data.image_size=48 does not fit model.network=swin_unetr: it needs image sides that are multiples "
        "of 32; set data.image_size=64",
    ),
]


def _fill(arg: str, c: SimpleNamespace) -> str:
    return arg.format(run=c.run, tmp=c.tmp, ckpt=c.ckpt)


@pytest.mark.slow
@pytest.mark.parametrize("s", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_cli_bad_input(s: S, trained, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    c = SimpleNamespace(tmp=tmp_path, run=run, ckpt=run / "checkpoints" / "last.ckpt", proc=None)
    c.before = {
        n: p.read_bytes()
        for n in ("config.yaml", "logs/metrics.csv", "history.csv", "efr.csv")
        if (p := run / n).is_file()
    }
    try:
        if s.prep:
            s.prep(c)
        c.before[".robusttrain.lock"] = (
            (run / ".robusttrain.lock").read_bytes() if (run / ".robusttrain.lock").exists() else b""
        )
        capsys.readouterr()
        code = main([_fill(a, c) for a in s.argv])
        out, err = capsys.readouterr()
    finally:
        if c.proc is not None:
            c.proc.kill()
            c.proc.wait()
    assert "Traceback" not in err
    assert code == s.code, err[-2000:]
    command = s.argv[0]
    errors = [line for line in err.splitlines() if line.startswith(f"robusttrain {command}: error:")]
    if s.code == 2:
        assert len(errors) == 1, err[-2000:]
        assert _fill(s.text, c) in errors[0], errors[0]
    else:
        assert not errors, errors
    if s.then:
        s.then(c, out, err)


def test_there_are_enough_scenarios():
    assert len(SCENARIOS) >= 35 and len({s.id for s in SCENARIOS}) == len(SCENARIOS)
