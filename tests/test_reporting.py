"""Plots and the HTML report, on hand-made run directories in the documented file formats."""

from __future__ import annotations

import base64
import re
import struct

import matplotlib.image
import pandas as pd
import pytest
from test_reporting_helpers import CLASSES, CORNER, PERTURBATIONS, make_run_dir, perturbed_dice

from robusttrain.reporting import load, tables, write_plots, write_report


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plots_are_valid_pngs_of_readable_size(tmp_path):
    run = make_run_dir(tmp_path / "run")
    written = write_plots(run)
    assert set(written) == {"efr", "clean_dice", "tradeoff", f"corner_{CORNER}"}
    for name, path in written.items():
        assert path.parent == run / "plots"
        w, h = png_size(path.read_bytes())
        assert 500 <= w <= 2000 and 250 <= h <= 1000, (name, w, h)
        img = matplotlib.image.imread(path)  # decodes fully
        assert img.std() > 0.01, f"{name} is blank"
    # corner-case figure: one panel per class, so wider than tall
    w, h = png_size(written[f"corner_{CORNER}"].read_bytes())
    assert w > 2 * h
    # regenerating is idempotent and leaves no temp files behind
    write_plots(run)
    assert sorted(p.name for p in (run / "plots").iterdir()) == sorted(p.name for p in written.values())


def test_efr_plot_has_the_perturbed_dice_panel_with_or_without_the_columns(tmp_path):
    from robusttrain.reporting.plots import efr_series, plot_efr

    new = load.load_efr(make_run_dir(tmp_path / "new", epochs=3, endpoints=True, heldout=("blur",)))
    old = load.load_efr(make_run_dir(tmp_path / "old", epochs=3))
    series = efr_series(new)
    last = series[(series.epoch == 2) & (series.perturbation == "contrast") & (series.threshold == 0.5)]
    assert last.perturbed_dice.item() == pytest.approx(
        100 * (perturbed_dice(2, 1, 2) + perturbed_dice(2, 1, 4)) / 2
    )
    assert efr_series(old).perturbed_dice.isna().all()
    for efr, text in ((new, "Mean Dice on the perturbed images"), (old, "perturbed Dice not recorded")):
        fig = plot_efr(efr)
        assert len(fig.axes) == 3  # two thresholds, then the Dice
        shown = [t.get_text() for t in fig.axes[-1].texts] + [fig.axes[-1].get_title()]
        assert any(text in s for s in shown), shown
    labels = fig.legends[0].get_texts() if fig.legends else []
    new_labels = [t.get_text() for t in plot_efr(new).legends[0].get_texts()]
    assert "blur (held out)" in new_labels and "worst family" in new_labels and labels


def test_plots_without_files_write_nothing(tmp_path):
    assert write_plots(tmp_path) == {}


def test_efr_table_in_paper_layout(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=3)
    efr = load.load_efr(run)
    out = tables.efr_tables(efr)
    assert list(out) == [0.5, 0.25]
    t5 = out[0.5]
    assert list(t5.index) == PERTURBATIONS + ["All"]
    assert list(t5.columns) == [
        ("val", "Dice"),
        ("val", "IoU"),
        ("val", "perturbed Dice"),
        ("val", "worst family"),
        ("val", "worst family Dice"),
    ]
    # this efr.csv predates the Dice columns: said so, no crash
    assert set(t5[("val", "perturbed Dice")]) == {"not recorded"}
    assert t5.loc["All", ("val", "worst family")] == "not recorded"
    last = efr[
        (efr.epoch == 2) & (efr.perturbation == "blur") & (efr.metric == "dice") & (efr.threshold == 0.5)
    ]
    per_sev = last[last.severity > 0]
    expected = 100 * per_sev.errors.sum() / per_sev.cases.sum()
    assert t5.loc["blur", ("val", "Dice")] == pytest.approx(expected)  # pooled row not double-counted
    assert t5.loc["blur", ("val", "Dice")] == pytest.approx(100 * last[last.severity == 0].efr.item())
    alls = efr[
        (efr.epoch == 2) & (efr.perturbation == "all") & (efr.metric == "iou") & (efr.threshold == 0.5)
    ]
    assert t5.loc["All", ("val", "IoU")] == pytest.approx(100 * alls.efr.item())


def test_efr_tables_put_the_perturbed_and_worst_family_dice_beside_each_rate(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=3, endpoints=True, heldout=("specularity",))
    efr = load.load_efr(run)
    t5 = tables.efr_tables(efr)[0.5]
    assert list(t5.index) == PERTURBATIONS + ["held-out families", "trained families", "All"]
    assert t5.columns[0] == ("", "held out")
    assert t5[("", "held out")].tolist() == ["", "", "yes", "yes", "", ""]
    dice = t5[("val", "perturbed Dice")]
    # by hand: equal cases per severity and family, so the pooled Dice is the plain mean
    fam = {p: (perturbed_dice(2, i, 2) + perturbed_dice(2, i, 4)) / 2 for i, p in enumerate(PERTURBATIONS)}
    assert dice["blur"] == pytest.approx(100 * fam["blur"])
    assert dice["All"] == pytest.approx(100 * sum(fam.values()) / 3)
    assert dice["held-out families"] == pytest.approx(100 * fam["specularity"])
    assert dice["trained families"] == pytest.approx(100 * (fam["blur"] + fam["contrast"]) / 2)
    assert t5.loc["All", ("val", "worst family")] == "specularity"
    assert t5.loc["trained families", ("val", "worst family")] == "contrast"
    assert t5.loc["All", ("val", "worst family Dice")] == pytest.approx(100 * fam["specularity"])
    held = efr[(efr.epoch == 2) & (efr.perturbation == "specularity") & (efr.metric == "dice")]
    held = held[(held.threshold == 0.5) & (held.severity > 0)]
    assert t5.loc["held-out families", ("val", "Dice")] == pytest.approx(
        100 * held.errors.sum() / held.cases.sum()
    )
    console = tables.last_efr_by_perturbation(efr)
    assert console.loc["All", "perturbed Dice"] == pytest.approx(dice["All"])
    assert console.loc["specularity", "held out"] == "yes"
    html = write_report(run).read_text()
    assert "perturbed Dice" in html and "worst family" in html and "held out" in html
    assert f"{100 * fam['specularity']:.1f}" in html  # the worst family's Dice, as the table shows it


def test_wandb_scalars_carry_the_perturbed_dice_beside_the_rates(tmp_path):
    from robusttrain.reporting.wandb_charts import efr_scalars

    new = efr_scalars(
        load.load_efr(make_run_dir(tmp_path / "new", epochs=3, endpoints=True, heldout=("blur",)))
    )
    fam = {p: (perturbed_dice(2, i, 2) + perturbed_dice(2, i, 4)) / 2 for i, p in enumerate(PERTURBATIONS)}
    assert new["mr/perturbed_dice/contrast"] == pytest.approx(fam["contrast"])
    assert new["mr/perturbed_dice/all"] == pytest.approx(sum(fam.values()) / 3)
    assert new["mr/perturbed_dice/worst_family"] == pytest.approx(fam["specularity"])
    assert new["mr/perturbed_dice/heldout"] == pytest.approx(fam["blur"])
    assert new["mr/perturbed_dice/trained"] == pytest.approx((fam["contrast"] + fam["specularity"]) / 2)
    old = efr_scalars(load.load_efr(make_run_dir(tmp_path / "old", epochs=3)))
    assert "mr/efr/all/dice@0.5" in old and not any("perturbed_dice" in k for k in old)  # not recorded
    assert {k: v for k, v in new.items() if "/efr/" in k} == old  # the rates are the same


def test_report_has_every_section_and_inlined_images(tmp_path):
    run = make_run_dir(tmp_path / "run")
    path = write_report(run)
    assert path == run / "report.html"
    text = path.read_text()
    for anchor in ("summary", "clean-dice", "efr-table", "efr-curves", "corner-cases", "failures", "gallery"):
        assert f'<section id="{anchor}">' in text
    assert CORNER in text and "last_inlier" in text and "recipe: acdc" in text
    srcs = re.findall(r'<img alt="[^"]*" src="([^"]+)"', text)
    assert len(srcs) == 4 + 5 + 1  # efr, clean dice, trade-off, one corner case, five failure thumbs, gallery
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        png_size(base64.b64decode(src.split(",", 1)[1]))
    assert "http://" not in text and "https://" not in text  # self-contained
    # no gallery.png: drawn from the failures' source tiles with the run's perturbations
    assert "Drawn from the source images of the worst failures" in text
    assert not (run / "plots" / "gallery.png").exists()  # a report writes nothing into the run directory


def test_report_degrades_per_section(tmp_path):
    run = make_run_dir(tmp_path / "run", corners=False, failures=False)
    (run / "efr.csv").unlink()
    text = write_report(run).read_text()
    assert "not available: efr.csv missing" in text
    assert "not available: corner_cases.json missing" in text
    assert "not available: failures/failures.jsonl missing" in text
    assert "Clean validation Dice" not in text  # plot titles live in PNGs, not HTML
    assert text.count("<img") == 2  # clean Dice and the checkpoint trade-off (history only) still there

    assert "not available: gallery.png missing and no failure thumbnails" in text

    empty = write_report(tmp_path / "empty").read_text()
    assert "not available: history.csv missing" in empty


def test_report_prefers_check_efr_table(tmp_path):
    run = make_run_dir(tmp_path / "run")
    pd.DataFrame({"perturbation": ["blur"], "val Dice": [1.5], "val IoU": [2.5]}).to_csv(
        run / "efr_table.csv", index=False
    )
    text = write_report(run).read_text()
    assert "efr_table.csv" in text and "2.5" in text


def test_corner_case_table_reads_history_at_marked_epochs(tmp_path):
    run = make_run_dir(tmp_path / "run", epochs=6)
    history, corners = load.load_history(run), load.load_corners(run)
    table = tables.corner_case_table(history, corners)
    row = table.iloc[0]
    at = history[(history.case_id == CORNER)].set_index("epoch")
    assert row["case"] == CORNER and row["outlier epochs"] == "4, 5"
    for k in CLASSES:
        assert row[f"dice_{k} @ balanced"] == pytest.approx(at.loc[3, f"dice_{k}"], abs=1e-3)
        assert row[f"dice_{k} @ least-loss"] == pytest.approx(at.loc[5, f"dice_{k}"], abs=1e-3)
    comp = tables.epoch_comparison(history, corners).set_index("checkpoint")
    assert comp.loc["balanced", "worst corner-case Dice"] > comp.loc["least-loss", "worst corner-case Dice"]


def test_report_inlines_an_existing_gallery(tmp_path):
    from test_reporting_helpers import write_png

    run = make_run_dir(tmp_path / "run", failures=False)
    write_png(run / "gallery.png", 3, size=(64, 200))
    text = write_report(run).read_text()
    section = text[text.index('<section id="gallery">') :]
    assert section.count("<img") == 1 and "not available" not in section.split("</section>")[0]


def test_failure_rows_with_overlays_or_thumbnail(tmp_path):
    import numpy as np

    from robusttrain.reporting import wandb_charts

    run = make_run_dir(tmp_path / "run")
    rec = load.load_failures(run)[0]
    # from the failure bank's files only: the thumbnail strip stands in, follow-up cell empty
    row = wandb_charts.failure_row(rec, None, CLASSES, rec["thumb"])
    assert row[:5] == [rec["epoch"], rec["case_id"], "val", rec["perturbation"], 4]
    assert row[7] == pytest.approx(rec["drop"]) and row[9] is None
    # with the MR callback's images: GT and each prediction as mask overlays
    gt = np.zeros((16, 16), np.uint8)
    gt[4:8, 4:8] = 3
    images = {
        "source": np.full((16, 16, 3), 90, np.uint8),
        "followup": np.full((16, 16, 3), 30, np.uint8),
        "gt": gt,
        "pred_source": gt,
        "pred_followup": np.zeros_like(gt),
    }
    row = wandb_charts.failure_row(rec, images, CLASSES)
    for cell in row[8:]:
        assert set(cell._masks) == {"ground_truth", "prediction"}
        assert cell._masks["ground_truth"]._val["class_labels"] == {
            0: "background",
            1: "rv",
            2: "myo",
            3: "lv",
        }


def test_the_drawn_gallery_reads_each_source_lesion_from_its_strip(tmp_path):
    # the report draws its gallery from failure strips (source | follow-up | ground truth | predictions); the
    # ground-truth tile is the lesion mask the placed families keep clear, as in training and in the check
    import numpy as np

    from robusttrain.mining.bank import _png, thumbnail_strip
    from robusttrain.reporting.html import _source_tiles

    rng = np.random.default_rng(0)
    gt = np.zeros((48, 48), np.int64)
    gt[10:30, 12:40] = 1
    src = rng.random((48, 48, 3)).astype(np.float32)
    strip = thumbnail_strip(
        {"source": src, "followup": src, "gt": gt, "pred_source": gt, "pred_followup": 0 * gt}, height=48
    )
    (tmp_path / "thumbs").mkdir()
    (tmp_path / "thumbs" / "0.png").write_bytes(_png(strip))
    images, masks = _source_tiles(tmp_path, [{"thumb": "thumbs/0.png", "drop": 0.5}], 2)
    assert len(images) == len(masks) == 1
    assert (images[0] == (src * 255).round().astype(np.uint8)).all()
    assert masks[0].shape == (48, 48) and (masks[0] == (gt > 0)).all()
