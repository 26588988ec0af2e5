"""Issue 20 ("Trust v3"): shared run directories are untrusted data, every stop is recoverable, every odd
input gets one line. Each scenario runs the CLI in-process and asserts the exact outcome: the exit code,
exactly one ``robusttrain <command>: error: ...`` line containing the expected text (codes 2, 3, 130),
no traceback, and what the scenario's ``then`` checks (files written, not written, unchanged).
"""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from toys import quiet_trainer

from robusttrain.cli import main
from robusttrain.rundir.lock import LOCK_NAME, OWNER_NAME

from .test_cli import TINY

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trust") / "run"
    assert main(["fit", *TINY, f"run_dir={run}", "trainer.max_epochs=2"]) == 0
    return run


@dataclass
class S:
    id: str
    argv: list[str]
    code: int = 2
    text: str | None = None
    prep: Callable[[SimpleNamespace], None] | None = None
    then: Callable[[SimpleNamespace, str, str], None] | None = None
    stderr: str | None = None  # text that must also be on stderr (an announcement)


# --- preparations ---------------------------------------------------------------------------------
def _config_target(target: str, **kw):
    def prep(c):
        cfg = (c.run / "config.yaml").read_text()
        args = "".join(f"\n      {k}: {json.dumps(v)}" for k, v in kw.items())
        cfg = cfg.replace("_target_: robusttrain.metamorphic.suite.MRSuite", f"_target_: {target}{args}", 1)
        (c.run / "config.yaml").write_text(cfg)

    return prep


def _config_python_tag(c):
    cfg = (c.run / "config.yaml").read_text()
    (c.run / "config.yaml").write_text(cfg + f"evil: !!python/object/apply:os.mkdir ['{c.tmp / 'pwned'}']\n")


def _failure_with(**fields):
    def prep(c):
        rec = {
            "kind": "failure",
            "id": "x0",
            "case_id": "c",
            "perturbation": "blur",
            "severity": 4,
            "epoch": 0,
            "split": "val",
            "src_dice": 0.9,
            "fol_dice": 0.1,
            "drop": 0.9,
            **fields,
        }
        marker = {"kind": "batch", "epoch": 0, "seen": [], "n": 1}  # a complete batch (rundir/failures.py)
        (c.run / "failures" / "failures.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(marker) + "\n")

    return prep


def _symlink(name: str):
    def prep(c):
        (c.tmp / "secret.csv").write_text("case_id,epoch,dice_polyp\nSECRET,0,0.5\n")
        target = c.run / name
        target.unlink(missing_ok=True)
        target.symlink_to(c.tmp / "secret.csv")

    return prep


def _write(name: str, data: bytes | str, append: bool = False):
    def prep(c):
        p = c.run / name
        p.parent.mkdir(parents=True, exist_ok=True)
        raw = data.encode() if isinstance(data, str) else data
        p.write_bytes((p.read_bytes() if append else b"") + raw)

    return prep


def _recipe(name: str, text: str | None = None):
    def prep(c):
        (c.tmp / "recipes").mkdir(exist_ok=True)
        src = ROOT / "robusttrain" / "recipes" / f"{name}.yaml"
        (c.tmp / "recipes" / f"{name}.yaml").write_text(text if text is not None else src.read_text())

    return prep


def _hold_lock(c):
    code = (
        "import sys, time; from filelock import FileLock; l = FileLock(sys.argv[1], timeout=0); "
        "l.acquire(); print('held', flush=True); time.sleep(60)"
    )
    c.proc = subprocess.Popen(
        [sys.executable, "-c", code, str(c.run / LOCK_NAME)], stdout=subprocess.PIPE, text=True
    )
    assert c.proc.stdout.readline().strip() == "held"


def _killed_owner(command: str, drop_last: bool = False):
    def prep(c):
        (c.run / OWNER_NAME).write_text(
            json.dumps({"pid": 999999, "host": "h", "command": command, "since": "earlier"})
        )
        if drop_last:  # a fit killed before its first last.ckpt: only an epoch checkpoint, rows of epoch 0
            for p in (c.run / "checkpoints").glob("*.ckpt"):
                p.unlink()
            (c.run / "checkpoints" / "epoch000.ckpt").write_bytes(b"dead attempt")

    return prep


def _temps(c):
    (c.run / ".history.csv.ab12CD_3.robusttrain.tmp").write_text("half")
    (c.run / "checkpoints" / ".last.ckpt.zz99yy88.robusttrain.tmp").write_bytes(b"half")
    (c.run / ".notes.txt.tmp").write_text("the user's")
    (c.run / "mine").mkdir()
    (c.run / "mine" / ".x.ab12CD_3.robusttrain.tmp").write_text("the user's, in a folder of theirs")


def _sweep_folder(c):
    shutil.copytree(c.run, c.tmp / "lr=0.01")


def _corners_plus(n: int):
    """A run whose corner_cases.json flags ``n`` cases (all present in history.csv)."""

    def prep(c):
        h = pd.read_csv(c.run / "history.csv")
        one = h[h["case_id"] == h["case_id"].iloc[0]]
        rows = [one.assign(case_id=f"k{i:03d}") for i in range(n)]
        pd.concat(rows).to_csv(c.run / "history.csv", index=False)
        cc = json.loads((c.run / "corner_cases.json").read_text())
        cc["corner_cases"] = [{"case_id": f"k{i:03d}", "score": 1.0} for i in range(n)]
        (c.run / "corner_cases.json").write_text(json.dumps(cc))

    return prep


def _mathtext_case(c):
    h = pd.read_csv(c.run / "history.csv")
    first = h["case_id"].iloc[0]
    h["case_id"] = h["case_id"].replace(first, "$x^{$")
    h.to_csv(c.run / "history.csv", index=False)
    cc = json.loads((c.run / "corner_cases.json").read_text())
    cc["corner_cases"] = [{"case_id": "$x^{$", "score": 1.0}]
    (c.run / "corner_cases.json").write_text(json.dumps(cc))


def _crafted_state(where: Callable[[dict], tuple[dict, str]], value):
    """A real checkpoint of the run whose saved training state has ``value`` at one key."""

    def prep(c):
        import torch

        ckpt = torch.load(c.run / "checkpoints" / "last.ckpt", weights_only=True)
        node, key = where(ckpt)
        node[key] = value
        torch.save(ckpt, c.tmp / "crafted.ckpt")

    return prep


def _balanced_state(ckpt):
    return ckpt["callbacks"][
        next(k for k in ckpt["callbacks"] if k.startswith("BalancedCheckpoint"))
    ], "monitor_values"


def _raise_in(target: str, exc: BaseException):
    def prep(c):
        def boom(*a, **k):
            raise exc

        c.monkeypatch.setattr(target, boom)

    return prep


# --- checks -----------------------------------------------------------------------------------------
def _no(*names: str):
    def then(c, out, err):
        for n in names:
            assert not (c.tmp / n).exists(), f"{n} exists: something from the run directory ran"

    return then


def _unchanged(*names: str):
    def then(c, out, err):
        for n in names:
            assert (c.run / n).read_bytes() == c.before[n], f"{n} was modified"

    return then


def _report_has(*texts: str, absent: tuple[str, ...] = ()):
    def then(c, out, err):
        html = (c.run / "report.html").read_text()
        for t in texts:
            assert t in html, t
        for t in absent:
            assert t not in html, t

    return then


def _img_count(prefix: str, n: int):
    def then(c, out, err):
        html = (c.run / "report.html").read_text()
        assert html.count(f'<img alt="{prefix}') == n

    return then


def _temps_left(c, out, err):
    left = sorted(str(p.relative_to(c.run)) for p in c.run.rglob("*.tmp"))
    assert left == [".notes.txt.tmp", "mine/.x.ab12CD_3.robusttrain.tmp"], left
    assert "removed 2 temporary file(s)" in err


def _fresh_epochs(expected: list[int]):
    def then(c, out, err):
        m = pd.read_csv(c.run / "logs" / "metrics.csv")
        assert sorted(set(m["epoch"].dropna().astype(int))) == expected
        assert list(m.dropna(subset=["val/dice"])["epoch"]) == expected  # no rows of the earlier run
        assert (c.run / "checkpoints" / "epoch000.ckpt").read_bytes() != b"dead attempt"

    return then


def _err(*parts: str):
    """More of the one error line than ``text`` can hold: each part must be in it."""

    def then(c, out, err):
        line = next(x for x in err.splitlines() if ": error:" in x)
        for part in parts:
            assert _fill(part, c) in line, (part, line)

    return then


def _scores_the_runs_weights(split: str):
    """validate/test with ``ckpt=last`` under another suite: the printed Dice is the run's own last
    validation Dice (its weights were loaded, not a fresh model's), and its config.yaml is untouched."""

    def then(c, out, err):
        m = pd.read_csv(c.run / "logs" / "metrics.csv")
        last = float(m.dropna(subset=["val/dice"])["val/dice"].iloc[-1])
        assert f"[robusttrain] {'validation' if split == 'val' else 'test'} {split}/dice={last:.4f}" in out, (
            last,
            out[-800:],
        )
        assert (c.run / "config.yaml").read_bytes() == c.before["config.yaml"]

    return then


def _and(*fs):
    def then(c, out, err):
        for f in fs:
            f(c, out, err)

    return then


RUN, CK = "run_dir={run}", "ckpt={run}/checkpoints/last.ckpt"
OWN_SUITE = [a for a in TINY if ".suite." not in a]  # check then uses the suite of the run's config.yaml
SCENARIOS = [
    # --- a run directory is data (security) -------------------------------------------------------
    S(
        "check-config-target-write-text",
        ["check", *OWN_SUITE, "run_dir={tmp}/c", CK],
        text="'callbacks.metamorphic.suite._target_' is 'pathlib.Path.write_text'",
        prep=_config_target("pathlib.Path.write_text", self="{tmp}/pwned", data="x"),
        then=_no("pwned", "c"),
    ),
    S(
        "check-config-target-copyfile",
        ["check", *OWN_SUITE, "run_dir={tmp}/c", CK],
        text="is 'shutil.copyfile'; expected robusttrain.metamorphic.suite.MRSuite",
        prep=_config_target("shutil.copyfile", src="/etc/hostname", dst="{tmp}/pwned"),
        then=_no("pwned"),
    ),
    S(
        "check-config-nested-target",
        ["check", *OWN_SUITE, "run_dir={tmp}/c", CK],
        text="key 'callbacks.metamorphic.suite.perturbation_kwargs._target_' is not allowed",
        prep=_config_target(
            "robusttrain.metamorphic.suite.MRSuite",
            perturbation_kwargs={"_target_": "builtins.open", "file": "x"},
        ),
    ),
    S(
        "check-config-python-tag",
        ["check", *OWN_SUITE, "run_dir={tmp}/c", CK],
        text="could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.mkdir'",
        prep=_config_python_tag,
        then=_and(_no("pwned"), _err("cannot read '{run}/config.yaml:")),
    ),
    S(
        "check-config-symlink",
        ["check", *OWN_SUITE, "run_dir={tmp}/c", CK],
        text="config.yaml' is a symbolic link",
        prep=lambda c: (
            shutil.copy(c.run / "config.yaml", c.tmp / "cfg.yaml"),
            (c.run / "config.yaml").unlink(),
            (c.run / "config.yaml").symlink_to(c.tmp / "cfg.yaml"),
        ),
    ),
    S(
        "report-script-in-severity",
        ["report", "{run}"],
        code=0,
        prep=_failure_with(
            severity="<script>alert(1)</script>",
            epoch="<img src=x onerror=alert(2)>",
            case_id="<b>c</b>",
            split="</div><script>x</script>",
        ),
        then=_report_has(
            "&lt;script&gt;alert(1)&lt;/script&gt;",
            "&lt;img src=x onerror=alert(2)&gt;",
            absent=("<script>", "<img src=x", "<b>c</b>"),
        ),
    ),
    # a run file replaced by a symbolic link: the command refuses it, naming the file
    *(
        S(f"{cmd}-symlinked-{case}", [cmd, "{run}"], text=f"{name}' is a symbolic link", prep=_symlink(name))
        for cmd, case, name in [
            ("report", "efr-table", "efr_table.csv"),
            ("report", "history", "history.csv"),
            ("report", "efr", "efr.csv"),
            ("report", "corner-cases", "corner_cases.json"),
            ("corners", "history", "history.csv"),
        ]
    ),
    S(
        "local-recipe-shadows-packaged",
        ["check", "recipe=polyp"],
        text="check needs ckpt=PATH",
        prep=_recipe("polyp"),
        stderr="./recipes/polyp.yaml replaces the packaged recipe file polyp.yaml",
    ),
    S(
        "recipe-python-tag",
        ["fit", "recipe=evil"],
        text="Python tags are not allowed",
        prep=_recipe("evil", "defaults:\n  - smoke\n  - _self_\nx: !!python/object/apply:os.getcwd []\n"),
    ),
    S(
        "recipe-yaml-syntax",
        ["fit", "recipe=broken"],
        text="recipes/broken.yaml:2': expected ',' or ']'",
        prep=_recipe("broken", "a: [1\nb: 2\n"),
    ),
    # --- every stop is recoverable; nothing replaced ------------------------------------------------
    S(
        "fresh-fit-into-finished-run",
        ["fit", *TINY, RUN, "trainer.max_epochs=1"],
        text="is not empty (balanced.ckpt, balanced_average.ckpt, balanced_average.json, checkpoints, config.yaml",
        then=_unchanged("config.yaml", "history.csv", "efr.csv", "corner_cases.json", "logs/metrics.csv"),
    ),
    S(
        "fresh-fit-overwrite-true",
        ["fit", *TINY, RUN, "trainer.max_epochs=1", "overwrite=true"],
        code=0,
        prep=_write("checkpoints/epoch000.ckpt", b"dead attempt"),  # the old run's file: must be replaced
        then=_fresh_epochs([0]),
        stderr="overwrite=true: removed config.yaml, logs, checkpoints",
    ),
    S("overwrite-bad-value", ["fit", *TINY, RUN, "overwrite=yes"], text="bad value for 'overwrite': 'yes'"),
    S(
        "rerun-after-kill-before-first-last-ckpt",
        ["fit", *TINY, RUN, "trainer.max_epochs=1"],
        code=0,
        prep=_killed_owner("fit", drop_last=True),
        then=_fresh_epochs([0]),
        stderr="the fit there stopped before its first checkpoint (nothing to resume); starting clean",
    ),
    S(
        "resume-after-kill-before-first-last-ckpt",
        ["fit", *TINY, RUN, "trainer.max_epochs=1", "ckpt=last"],
        code=0,
        prep=_killed_owner("fit", drop_last=True),
        then=_fresh_epochs([0]),
        stderr="starting clean",
    ),
    S(
        "temp-cleanup-own-names-only",
        ["validate", *TINY, RUN, "ckpt=last"],
        code=0,
        prep=_temps,
        then=_temps_left,
    ),
    S(
        "run-dir-locked-by-other-process",
        ["validate", *TINY, RUN, "ckpt=last"],
        text="is in use by another robusttrain command",
        prep=_hold_lock,
    ),
    S(
        "lock-of-killed-command-taken-over",
        ["validate", *TINY, RUN, "ckpt=last"],
        code=0,
        prep=_killed_owner("validate"),
        stderr="took over the lock of an interrupted run (pid 999999, validate",
        then=lambda c, o, e: not (c.run / OWNER_NAME).exists() or pytest.fail("owner record left"),
    ),
    S(
        "lock-path-is-a-folder",
        ["validate", *TINY, RUN, "ckpt=last"],
        text=f"{LOCK_NAME}' is a folder",
        prep=lambda c: (c.run / LOCK_NAME).mkdir(),
    ),
    S(
        "file-named-plots",
        ["fit", *TINY, RUN, "ckpt=last", "trainer.max_epochs=3"],
        text="plots' is a file where robusttrain writes a folder",
        prep=lambda c: (shutil.rmtree(c.run / "plots"), (c.run / "plots").write_text("mine")),
        # refused before training: no epoch was added, and the user's file is theirs
        then=lambda c, o, e: (
            _unchanged("logs/metrics.csv", "history.csv")(c, o, e),
            (c.run / "plots").read_text() == "mine" or pytest.fail("plots was changed"),
        ),
    ),
    S(
        "file-named-checkpoints",
        ["validate", *TINY, RUN, "ckpt={tmp}/last.ckpt"],
        text="checkpoints' is a file where robusttrain writes a folder",
        prep=lambda c: (
            shutil.copy(c.run / "checkpoints" / "last.ckpt", c.tmp / "last.ckpt"),
            shutil.rmtree(c.run / "checkpoints"),
            (c.run / "checkpoints").write_text("mine"),
        ),
    ),
    S(
        "fit-resume-crafted-callback-state",
        ["fit", *TINY, RUN, "ckpt={tmp}/crafted.ckpt", "trainer.max_epochs=3"],
        text="crafted.ckpt': its saved training state cannot be restored (AttributeError",
        prep=_crafted_state(_balanced_state, "abc"),
    ),
    S(
        "fit-resume-crafted-datamodule-state",
        ["fit", *TINY, RUN, "ckpt={tmp}/crafted.ckpt", "trainer.max_epochs=3"],
        text="crafted.ckpt': its saved training state cannot be restored",
        prep=_crafted_state(lambda ckpt: (ckpt, "PolypDataModule"), {"rng": 7, "augment": "x"}),
    ),
    # --- readers refuse what they cannot read correctly ---------------------------------------------
    S(
        "corners-torn-history-row",
        ["corners", "{run}"],
        text="has 2 field(s), expected 4 (a torn or edited row)",
        prep=_write("history.csv", "k9,1", append=True),
        then=_err("run-directory file '{run}/history.csv' line "),
    ),
    S(
        "report-garbage-efr",
        ["report", "{run}"],
        text="efr.csv' is not text (byte 0xff at offset 0",
        prep=_write("efr.csv", b"\xff\xfe\x00garbage\x9c"),
    ),
    S(
        "report-corner-cases-not-json",
        ["report", "{run}"],
        text="corner_cases.json' is not valid JSON",
        prep=_write("corner_cases.json", '{"corner_cases": ['),
    ),
    # --- one line per failure, documented exit codes ------------------------------------------------
    S(
        "report-disk-full",
        ["report", "{run}"],
        code=3,
        text="disk full (No space left on device) writing",
        prep=_raise_in(
            "robusttrain.reporting.html.atomic_write_text",
            OSError(errno.ENOSPC, "No space left on device", "/x/report.html"),
        ),
    ),
    S(
        "report-read-only-fs",
        ["report", "{run}"],
        code=3,
        text="read-only file system",
        prep=_raise_in(
            "robusttrain.reporting.html.atomic_write_text",
            OSError(errno.EROFS, "Read-only file system", "/x/report.html"),
        ),
    ),
    S(
        "report-permission-denied",  # as root (CI) chmod cannot refuse a write: the OSError is raised
        ["report", "{run}"],
        code=3,
        text="permission denied (Permission denied) writing '/x/report.html'; check the folder's permissions",
        prep=_raise_in(
            "robusttrain.reporting.html.atomic_write_text",
            OSError(errno.EACCES, "Permission denied", "/x/report.html"),
        ),
    ),
    S(
        "fit-run-dir-under-a-file",  # a real file where run_dir needs a folder (no mock)
        ["fit", *TINY, "run_dir={tmp}/afile/run"],
        text="cannot create run_dir '{tmp}/afile/run': Not a directory",
        prep=lambda c: (c.tmp / "afile").write_text("mine"),
        then=lambda c, o, e: (c.tmp / "afile").read_text() == "mine" or pytest.fail("afile changed"),
    ),
    S(
        "report-ctrl-c",
        ["report", "{run}"],
        code=130,
        text="stopped by Ctrl-C (SIGINT)",
        prep=_raise_in("robusttrain.reporting.html.render_report", KeyboardInterrupt()),
    ),
    S(
        "check-ctrl-c",
        ["check", *OWN_SUITE, "run_dir={tmp}/c", CK],
        code=130,
        text="stopped by Ctrl-C",
        prep=_raise_in("robusttrain.metamorphic.audit.audit", KeyboardInterrupt()),
    ),
    S("report-mathtext-case-id", ["report", "{run}"], code=0, prep=_mathtext_case, then=_report_has("$x^{$")),
    S(
        "report-many-corner-cases-bounded",
        ["report", "{run}"],
        code=0,
        prep=_corners_plus(40),
        then=_and(_img_count("corner case", 24), _report_has("Curves of the first 24 of 40 flagged cases")),
    ),
    # --- commands that refused good input -----------------------------------------------------------
    S(
        "validate-ckpt-of-another-suite",
        ["validate", *TINY, RUN, "ckpt=last", "callbacks.metamorphic.suite.perturbations=[blur]"],
        code=0,
        then=_scores_the_runs_weights("val"),
    ),
    S(
        "test-ckpt-of-another-suite",
        ["test", *TINY, RUN, "ckpt=last", "callbacks.metamorphic.suite.severities=[2]"],
        code=0,
        then=_scores_the_runs_weights("test"),
    ),
    S(
        "corners-folder-with-equals",
        ["corners", "lr=0.01"],
        code=0,
        prep=_sweep_folder,
        then=lambda c, o, e: "corner-case report: lr=0.01" in o or pytest.fail(o),
    ),
    S(
        "report-folder-with-equals",
        ["report", "lr=0.01"],
        code=0,
        prep=_sweep_folder,
        then=lambda c, o, e: (c.tmp / "lr=0.01" / "report.html").is_file() or pytest.fail(e),
    ),
]


def _fill(arg: str, c) -> str:
    return arg.replace("{run}", str(c.run)).replace("{tmp}", str(c.tmp))


@pytest.mark.parametrize("s", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_trust(s: S, trained, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    c = SimpleNamespace(tmp=tmp_path, run=run, proc=None, monkeypatch=monkeypatch)
    c.before = {
        n: p.read_bytes()
        for n in ("config.yaml", "logs/metrics.csv", "history.csv", "efr.csv", "corner_cases.json")
        if (p := run / n).is_file()
    }
    try:
        if s.prep:
            # placeholders inside prepared files (a config's arguments) name this test's folder
            s.prep(c)
            cfg = run / "config.yaml"
            if cfg.is_file() and not cfg.is_symlink() and "{tmp}" in cfg.read_text():
                cfg.write_text(_fill(cfg.read_text(), c))
        capsys.readouterr()
        code = main([_fill(a, c) for a in s.argv])
        out, err = capsys.readouterr()
    finally:
        if c.proc is not None:
            c.proc.kill()
            c.proc.wait()
    assert "Traceback" not in err, err[-3000:]
    assert code == s.code, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith(f"robusttrain {s.argv[0]}: error:")]
    if s.code == 0:
        assert not errors, errors
    else:
        assert len(errors) == 1, err[-2000:]
        assert _fill(s.text, c) in errors[0], errors[0]
    if s.stderr:
        assert s.stderr in err, err[-2000:]
    if s.then:
        s.then(c, out, err)


def test_every_scenario_id_is_unique():
    assert len({s.id for s in SCENARIOS}) == len(SCENARIOS) >= 35


def test_api_fit_takes_the_run_dir_lock(tmp_path):
    """The callbacks' context takes the CLI's lock: a trainer whose dirpath another process holds is
    refused before training; once that process is gone the same fit runs, writes its files and lets
    go of the lock when it ends."""
    from user_project import make

    from robusttrain.callbacks import BalancedCheckpoint
    from robusttrain.rundir.lock import RunDirBusyError, release

    L, Net, Data = make()
    run = tmp_path / "run"
    run.mkdir()
    holder = SimpleNamespace(run=run, proc=None)
    _hold_lock(holder)

    def fit():
        trainer = quiet_trainer(
            max_epochs=1,
            callbacks=[BalancedCheckpoint(dirpath=run, monitor="val_loss")],
            default_root_dir=tmp_path,
        )
        trainer.fit(Net(), datamodule=Data())

    try:
        with pytest.raises(RunDirBusyError, match="is in use by another robusttrain command"):
            fit()
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]  # nothing written
    finally:
        holder.proc.kill()
        holder.proc.wait()
    fit()
    release(run)  # a no-op: the trainer let go of the lock when its fit ended
    assert (run / "corner_cases.json").is_file()
    assert not (run / OWNER_NAME).exists() and not (run / LOCK_NAME).exists()
