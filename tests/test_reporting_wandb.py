"""RobustnessReporter in a real Lightning fit with the real MR + balanced callbacks and a real
offline WandbLogger; the offline run is read back from disk (the .wandb transaction log)."""

from __future__ import annotations

import json
import logging
import struct
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import PIL.Image
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from toys import Classes, quiet_trainer

from robusttrain.callbacks import BalancedCheckpoint, MetamorphicCallback, RobustnessReporter
from robusttrain.metamorphic.suite import MRSuite

pytestmark = pytest.mark.slow


def cases() -> Classes:
    """10 single-slice 48×48 cases, three classes in 14-px squares, the image clipped to [0, 1]."""
    return Classes(n_cases=10, size=48, box=14, slices=1, clamp=True)


# wandb's transaction log is LevelDB's log format behind a 7-byte file header (":W&B", magic
# 0xBEE1, version): 32 KiB blocks of records, each with a 7-byte header (crc32, length, type);
# a protobuf `Record` may be split FIRST/MIDDLE/LAST across blocks.
_BLOCK, _HDR, _FULL, _FIRST, _MIDDLE, _LAST = 32768, 7, 1, 2, 3, 4


def read_wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, "not a W&B transaction log"
    records, buf, pos = [], b"", 7
    while pos + _HDR <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HDR:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HDR])
        pos += _HDR
        chunk, pos = data[pos : pos + length], pos + length
        if kind == 0 and length == 0:
            continue  # zero padding
        buf = chunk if kind in (_FULL, _FIRST) else buf + chunk
        if kind in (_FULL, _LAST):
            rec = pb.Record()
            rec.ParseFromString(buf)
            records.append(rec)
            buf = b""
    return records


def finished_records(path: Path, timeout: float = 120.0) -> list:
    """The run's records once its ``exit`` record is on disk: wandb-core (a separate process) may still
    be writing the last records when ``wandb.finish()`` returns (seen on a loaded machine: the last
    epoch's table increment and the final summary were missing from a read made right after it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = read_wandb_records(path)
        except Exception:  # a record cut mid-write: read again
            if time.monotonic() > deadline:
                raise
            records = []
        if (records and records[-1].WhichOneof("record_type") == "exit") or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _items_to_dict(items) -> dict:
    # values logged as dicts (tables, charts) arrive flattened: nested_key ["failures/table", "_type"]
    out: dict = {}
    for it in items:
        path = [it.key] if it.key else list(it.nested_key)
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = json.loads(it.value_json)
    return out


def history_rows(records) -> list[dict]:
    return [_items_to_dict(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]


def summary(records) -> dict:
    out: dict = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            out.update(_items_to_dict(r.summary.update))
    return out


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, b, _):
        loss = nn.functional.cross_entropy(self(b["image"]), b["mask"])
        self.log("train/loss", loss, batch_size=len(b["mask"]))
        return loss

    def validation_step(self, b, _):
        self.log(
            "val/loss", nn.functional.cross_entropy(self(b["image"]), b["mask"]), batch_size=len(b["mask"])
        )

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


class Sink:
    def __init__(self):
        self.records = []

    def __call__(self, record, images=None):
        self.records.append(record)


class _Errors(logging.Handler):
    """Collects ERROR records with their traceback (a flaky missing final report was once unexplained)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(logging.Formatter().format(record))


class PlotSpy(pl.Callback):
    """Listed after the reporter: which PNGs existed when each training epoch had ended."""

    def __init__(self, run_dir):
        self.run_dir, self.seen = Path(run_dir), []

    def on_train_epoch_end(self, trainer, pl_module):
        self.seen.append(sorted(p.name for p in (self.run_dir / "plots").glob("*.png")))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    from lightning.pytorch.loggers import WandbLogger

    tmp = tmp_path_factory.mktemp("wandb_fit")
    run_dir = tmp / "run"
    # offline artifacts (the incremental table's increments) are staged under WANDB_DATA_DIR:
    # keep them in tmp, not in ~/.local/share/wandb
    mp = pytest.MonkeyPatch()
    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR"):
        mp.setenv(var, str(tmp / var.lower()))
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    pl.seed_everything(0)
    ds = cases()
    sink = Sink()
    from robusttrain.callbacks import RobustnessContext
    from robusttrain.metamorphic.suite import MRSuite

    ctx = RobustnessContext()
    ctx.subscribe(sink)
    mr = MetamorphicCallback(
        suite=MRSuite(["blur"], severities=(4,)),
        dirpath=str(run_dir),
        violation_threshold=0.0,
        class_names=["rv", "myo", "lv"],
        context=ctx,
        verbose=False,
    )
    reporter = RobustnessReporter(max_failures_per_epoch=3)  # joins the same context (the trainer's)
    spy = PlotSpy(run_dir)
    logger = WandbLogger(offline=True, save_dir=str(tmp), project="robusttrain-test")
    trainer = quiet_trainer(
        max_epochs=2, logger=logger, callbacks=[mr, BalancedCheckpoint(dirpath=run_dir), reporter, spy]
    )
    errors = _Errors()  # the final report swallows its exceptions (a fit must not fail on reporting):
    logging.getLogger("robusttrain.callbacks.reporting").addHandler(errors)  # surface them here
    try:
        trainer.fit(Tiny(), DataLoader(ds, batch_size=5, shuffle=True), DataLoader(ds, batch_size=5))
    finally:
        logging.getLogger("robusttrain.callbacks.reporting").removeHandler(errors)
    import wandb

    wandb.finish()
    mp.undo()
    assert not errors.lines, "the reporter logged an error:\n" + "\n".join(errors.lines)
    files = list((tmp / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    return {
        "run_dir": run_dir,
        "records": finished_records(files[0]),
        "wandb_dir": files[0].parent,
        "mr": mr,
        "sink": sink,
        "reporter": reporter,
        "tmp": tmp,
        "spy": spy,
    }


def test_efr_scalars_logged_once_by_the_mr_callback(fitted):
    rows = history_rows(fitted["records"])
    efr_rows = [r for r in rows if "mr/efr/blur/dice@0.25" in r]
    assert len(efr_rows) == 2  # one per epoch: the reporter did not duplicate the MR callback's keys
    mr_efr = fitted["mr"].efr
    last = mr_efr[
        (mr_efr.epoch == 1)
        & (mr_efr.perturbation == "blur")
        & (mr_efr.severity == 0)
        & (mr_efr.metric == "dice")
        & (mr_efr.threshold == 0.5)
    ]
    assert efr_rows[-1]["mr/efr/blur/dice@0.5"] == pytest.approx(float(last.efr.item()))
    # beside the rates, the mean Dice on the perturbed images (one family: it is the worst one)
    every = mr_efr[(mr_efr.epoch == 1) & (mr_efr.perturbation == "all")].iloc[0]
    assert efr_rows[-1]["mr/perturbed_dice/blur"] == pytest.approx(float(last.mean_fol_dice.item()))
    assert efr_rows[-1]["mr/perturbed_dice/all"] == pytest.approx(float(every.mean_fol_dice))
    assert every.worst_family == "blur" and efr_rows[-1]["mr/perturbed_dice/worst_family"] == pytest.approx(
        float(every.worst_family_dice)
    )
    assert 0 <= every.mean_fol_dice <= 1 and not mr_efr.heldout.any()


def test_failure_table_logged_incrementally_with_mask_overlays(fitted):
    rows = history_rows(fitted["records"])
    tables = [r["failures/table"] for r in rows if "failures/table" in r]
    failure_epochs = {r.epoch for r in fitted["sink"].records}
    assert failure_epochs, "the MR callback produced no failures to log"
    assert 1 <= len(tables) <= len(failure_epochs)
    assert all(t["_type"] == "incremental-table-file" and t["log_mode"] == "INCREMENTAL" for t in tables)
    assert [t["increment_num"] for t in tables] == list(range(len(tables)))
    # each logged increment's file holds only the rows new since the previous log
    bodies = [json.loads((fitted["wandb_dir"] / "files" / t["path"]).read_text()) for t in tables]
    sizes = [len(b["data"]) for b in bodies]
    assert all(1 <= n <= 3 for n in sizes)
    assert tables[-1]["nrows"] == sum(sizes) == len(fitted["reporter"]._logged)
    keys = [(r[1], r[3], r[4], r[0]) for b in bodies for r in b["data"]]
    assert len(set(keys)) == len(keys)  # no failure logged twice
    assert bodies[0]["columns"][:5] == ["epoch", "case_id", "split", "perturbation", "severity"]
    # the images themselves live in the increment artifacts (staged under tmp, not in $HOME)
    arts = [
        r.artifact
        for r in fitted["records"]
        if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "wandb-run-incremental-table"
    ]
    assert len(arts) >= len(tables)
    files = {e.path: Path(e.local_path) for e in arts[0].manifest.contents}
    assert all(str(fitted["tmp"]) in str(p) for p in files.values())
    body = json.loads(next(p for k, p in files.items() if k.endswith(".table.json")).read_text())
    assert len(body["data"]) <= 3
    row = body["data"][0]
    assert row[3] == "blur" and row[4] == 4 and row[6] < row[5] and 0 < row[7] <= 1
    for cell in (row[8], row[9]):  # source and follow-up, both with GT + prediction overlays
        assert cell["_type"] == "image-file" and cell["caption"].endswith(
            f"{row[5 if cell is row[8] else 6]:.3f}"
        )
        assert set(cell["masks"]) == {"ground_truth", "prediction"}
        for m in cell["masks"].values():
            mask = np.asarray(PIL.Image.open(files[m["path"]]))
            assert set(np.unique(mask)) <= {0, 1, 2, 3} and mask.shape == (48, 48)


def test_corner_case_charts_and_summary(fitted):
    rows = history_rows(fitted["records"])
    corners = json.loads((fitted["run_dir"] / "corner_cases.json").read_text())
    chart_keys = {k for r in rows for k in r if k.startswith("corners/")}
    summ = summary(fitted["records"])
    assert summ["corners/final"] is True
    assert summ["corners/policy"] == corners["policy"]
    assert summ.get("corners/least_loss_epoch") == corners["least_loss_epoch"]
    assert summ.get("corners/balanced_epoch") == corners["balanced_epoch"]
    flagged = [c["case_id"] for c in corners["corner_cases"]]
    assert summ["corners/cases"] == ",".join(flagged)
    # the seeded fit flags corner cases (else the chart checks below would check nothing)
    assert flagged
    # a line series per structure
    assert {"corners/dice_rv_table", "corners/dice_myo_table", "corners/dice_lv_table"} <= chart_keys
    chart = [r for r in rows if "corners/dice_lv_table" in r][-1]["corners/dice_lv_table"]
    assert chart["_type"] == "table-file" and chart["ncols"] == 3  # line_series: step, lineKey, lineVal
    data = json.loads((fitted["wandb_dir"] / "files" / chart["path"]).read_text())
    series: dict = {}
    for step, key, val in (dict(zip(data["columns"], row)).values() for row in data["data"]):
        series.setdefault(key, []).append((step, val))
    history = fitted["mr"].history
    mean = history.groupby("epoch")["dice_lv"].mean()
    assert [e for e, _ in series["cohort mean"]] == list(mean.index)
    assert [v for _, v in series["cohort mean"]] == pytest.approx(list(mean.values))
    case = history[history.case_id == flagged[0]].sort_values("epoch")
    assert [v for _, v in series[flagged[0]]] == pytest.approx(list(case.dice_lv))
    ll = corners["least_loss_epoch"]
    assert series[f"least-loss epoch {ll}"] == [(ll, 0.0), (ll, 1.0)]  # the vertical marker


def test_plots_written_when_the_fit_ends(fitted):
    # the default plots="end": nothing rendered during training (W&B charts follow every epoch) ...
    assert fitted["spy"].seen == [[], []]
    # ... and every plot once the fit has ended
    plots = fitted["run_dir"] / "plots"
    assert (plots / "efr.png").stat().st_size > 10_000
    assert (plots / "clean_dice.png").stat().st_size > 10_000
    corners = json.loads((fitted["run_dir"] / "corner_cases.json").read_text())
    assert corners["corner_cases"]  # (as above: the seeded fit flags some)
    for c in corners["corner_cases"]:
        assert (plots / f"corner_{c['case_id']}.png").is_file()


def test_plots_every_epoch_on_request(tmp_path):
    pl.seed_everything(0)
    ds, run_dir = cases(), tmp_path / "run"
    spy = PlotSpy(run_dir)
    mr = MetamorphicCallback(suite=MRSuite(["blur"], severities=(4,)), dirpath=str(run_dir), verbose=False)
    trainer = quiet_trainer(
        max_epochs=2, callbacks=[mr, RobustnessReporter(plots="epoch", console=False), spy]
    )
    trainer.fit(Tiny(), DataLoader(ds, batch_size=5), DataLoader(ds, batch_size=5))
    assert "efr.png" in spy.seen[0] and "clean_dice.png" in spy.seen[0]
    assert "tradeoff.png" in spy.seen[1]  # needs two epochs of history


@pytest.mark.parametrize("value", ["always", 1.5, None])
def test_plots_argument_checked_when_built(value):
    with pytest.raises(ValueError, match=r"plots="):
        RobustnessReporter(plots=value)
