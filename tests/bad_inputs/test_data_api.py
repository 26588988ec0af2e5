"""Bad inputs at the API level (issue 10, data/numbers half): each scenario asserts the exact outcome.

Either a specific exception whose message names the file / key / value and what was expected, or
the correct result (e.g. a 0/1 PNG mask gives the right non-empty mask and the right Dice).
Real files in tmp_path, real Albumentations, real PyOD, real Lightning trainers (tiny).
"""

from __future__ import annotations

import re

import cv2
import lightning.pytorch as L
import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from toys import quiet_trainer

from robusttrain import perturbations as P
from robusttrain.callbacks import BalancedCheckpoint, MetamorphicCallback
from robusttrain.metamorphic.batch import BatchHooks, iter_probe
from robusttrain.metamorphic.outputs import NonFiniteOutputError, ProbabilityOutputError
from robusttrain.metamorphic.runner import run_probe
from robusttrain.metamorphic.suite import MRSuite


# ----------------------------------------------------------------------------- tiny real training
class Blobs(Dataset):
    """A bright square (foreground) on a dark background; ``ids`` overrides the case ids."""

    def __init__(self, n=8, size=24, ids=None, nan_at=None):
        g = torch.Generator().manual_seed(0)
        self.x = 0.1 + 0.2 * torch.rand(n, 3, size, size, generator=g)
        self.m = torch.zeros(n, size, size, dtype=torch.long)
        for i in range(n):
            r = 2 + i % 6
            self.x[i, :, r : r + 8, r : r + 8] = 0.9
            self.m[i, r : r + 8, r : r + 8] = 1
        if nan_at is not None:
            self.x[nan_at, 1, 3, 3] = float("nan")
        self.ids = ids if ids is not None else [f"c{i}" for i in range(n)]

    def __len__(self):
        return len(self.x)

    def case_ids(self):
        return list(self.ids)

    def __getitem__(self, i):
        return {"image": self.x[i], "mask": self.m[i], "case_id": self.ids[i], "slice_index": 0}


class Net(L.LightningModule):
    """``mode``: "logits" (2-channel logits), "probs" (softmax already applied), "sigmoid" (1-channel
    probability), "nan" (NaN logits)."""

    def __init__(self, mode="logits"):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 2, 1)
        with torch.no_grad():  # a "bright pixel" detector: correct from the first epoch
            self.conv.weight.zero_()
            self.conv.weight[1] += 10.0
            self.conv.bias.copy_(torch.tensor([0.0, -15.0]))
        self.mode = mode

    def forward(self, x):
        z = self.conv(x)
        if self.mode == "nan":
            return z * float("nan")
        if self.mode == "sigmoid":  # one-channel foreground probability (sigmoid applied in the model)
            return torch.sigmoid(z[:, 1:] - z[:, :1])
        return torch.softmax(z, 1) if self.mode == "probs" else z

    def training_step(self, b, i):
        return torch.nn.functional.cross_entropy(self.conv(b["image"]), b["mask"]) * 0.0

    def validation_step(self, b, i):
        self.log("val/loss", torch.nn.functional.cross_entropy(self.conv(b["image"]), b["mask"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def _fit(tmp_path, model, ds, callbacks, epochs=1):
    trainer = quiet_trainer(max_epochs=epochs, callbacks=callbacks, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=4))
    return trainer


def _mr(tmp_path, **kw):
    return MetamorphicCallback(suite=MRSuite(["contrast"], (2,)), dirpath=str(tmp_path), verbose=False, **kw)


# ----------------------------------------------------------------------------- model outputs
def test_nan_logits_stop_the_check_naming_epoch_and_split_and_no_checkpoint(tmp_path):
    with pytest.raises(NonFiniteOutputError, match=r"contain NaN or inf at epoch 0 on the 'val' probe"):
        _fit(tmp_path, Net("nan"), Blobs(), [_mr(tmp_path), BalancedCheckpoint(dirpath=str(tmp_path))])
    assert not (tmp_path / "balanced.ckpt").exists() and not (tmp_path / "efr.csv").exists()


def test_nan_logits_stop_a_standalone_balanced_checkpoint(tmp_path):
    with pytest.raises(NonFiniteOutputError, match=r"model outputs \(logits\) contain NaN or inf at epoch 0"):
        _fit(tmp_path, Net("nan"), Blobs(), [BalancedCheckpoint(dirpath=str(tmp_path))])
    assert not (tmp_path / "balanced.ckpt").exists() and not (tmp_path / "corner_cases.json").exists()


def test_inf_probabilities_from_a_custom_converter_name_the_cases(tmp_path):
    suite = MRSuite(["contrast"], (2,))
    ds = Blobs(4)
    predict = lambda x: torch.full((x.shape[0], 2, *x.shape[2:]), float("inf"))
    with pytest.raises(
        NonFiniteOutputError, match=r"at epoch 3 on the 'train' probe \(cases \['c0', 'c1'\]\)"
    ):
        run_probe(predict, iter_probe(ds, [0, 1], 2, BatchHooks()), suite, "train", epoch=3)


def test_probabilities_passed_as_logits_are_refused_with_the_fix(tmp_path):
    with pytest.raises(
        ProbabilityOutputError,
        match=r"look like probabilities already \(2 channels.*"
        r"channels sum to 1.*to_probabilities='identity'",
    ):
        _fit(tmp_path, Net("probs"), Blobs(), [_mr(tmp_path)])


def test_sigmoid_outputs_one_channel_warn_once_and_are_read_as_logits(caplog):
    # one channel in [0,1] cannot tell logits from probabilities (issue 23): never a refusal
    conv = MetamorphicCallback(verbose=False).to_probabilities
    with caplog.at_level("WARNING"):
        p = conv(torch.tensor([0.1, 0.9, 0.5, 0.3]).view(1, 1, 2, 2))
        conv(torch.tensor([0.2, 0.8, 0.5, 0.3]).view(1, 1, 2, 2))
    assert torch.allclose(p[:, 1], torch.sigmoid(torch.tensor([0.1, 0.9, 0.5, 0.3]).view(1, 2, 2)))
    assert caplog.text.count("1 channel with every value in [0.1, 0.9]") == 1
    assert "MetamorphicCallback(hooks=BatchHooks(to_probabilities='identity'))" in caplog.text


def test_identity_opt_out_gives_the_same_scores_as_logits(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _fit(a, Net("logits"), Blobs(), [_mr(a)])
    _fit(b, Net("probs"), Blobs(), [_mr(b, hooks=BatchHooks(to_probabilities="identity"))])
    ha, hb = pd.read_csv(a / "history.csv"), pd.read_csv(b / "history.csv")
    assert ha["dice_fg"].min() == 1.0  # the detector is exact: Dice 1 for every case
    pd.testing.assert_frame_equal(ha, hb)


def test_one_channel_probabilities_warn_in_training_and_identity_scores_them_right(tmp_path, caplog):
    # sigmoid(probability) > 0.5 everywhere: "auto" says so once and the fit goes on (issue 23: a
    # heuristic never kills a run that has trained); 'identity' scores them right
    with caplog.at_level("WARNING"):
        _fit(tmp_path, Net("sigmoid"), Blobs(), [_mr(tmp_path)])
    assert caplog.text.count("logits or sigmoid probabilities?") == 1 and (tmp_path / "history.csv").is_file()
    _fit(
        tmp_path / "ok",
        Net("sigmoid"),
        Blobs(),
        [_mr(tmp_path / "ok", hooks=BatchHooks(to_probabilities="identity"))],
    )
    assert (pd.read_csv(tmp_path / "ok" / "history.csv")["dice_fg"] == 1.0).all()


def test_bad_to_probabilities_value_fails_at_construction():
    with pytest.raises(
        ValueError, match=r"to_probabilities='softmaxx': expected one of \('auto', 'logits', 'identity'\)"
    ):
        MetamorphicCallback(hooks=BatchHooks(to_probabilities="softmaxx"))


def test_identity_on_logits_is_refused():
    conv = MetamorphicCallback(hooks=BatchHooks(to_probabilities="identity"), verbose=False).to_probabilities
    with pytest.raises(ProbabilityOutputError, match=r"outputs lie in \[-3, 4\], not \[0,1\]"):
        conv(torch.tensor([-3.0, 4.0]).view(1, 2, 1, 1))


# ----------------------------------------------------------------------------- case ids, images
def test_integer_case_ids_are_plain_strings_in_history_and_corner_cases(tmp_path):
    ids = [1000 + i for i in range(8)]
    _fit(tmp_path, Net("logits"), Blobs(ids=ids), [_mr(tmp_path), BalancedCheckpoint(dirpath=str(tmp_path))])
    h = pd.read_csv(tmp_path / "history.csv", dtype={"case_id": str})
    assert sorted(h["case_id"]) == [str(i) for i in ids]
    text = (tmp_path / "mr_cases.csv").read_text() + (tmp_path / "corner_cases.json").read_text()
    assert "tensor" not in text and "1007" in text


def test_integer_case_ids_in_a_standalone_balanced_checkpoint(tmp_path):
    _fit(
        tmp_path,
        Net("logits"),
        Blobs(ids=[7, 7, 8, 8, 9, 9, 10, 10]),
        [BalancedCheckpoint(dirpath=str(tmp_path))],
    )
    h = pd.read_csv(tmp_path / "balanced_history.csv", dtype={"case_id": str})
    assert sorted(set(h["case_id"])) == ["10", "7", "8", "9"]


def test_integer_case_ids_from_a_custom_hook_are_plain_strings_in_replay():
    from robusttrain.mining.samples import SampleCodec

    hooks = BatchHooks(get_case_ids=lambda b: b["patient"])  # collated ints: a tensor
    sample = {"image": torch.rand(3, 8, 8), "mask": torch.zeros(8, 8, dtype=torch.long), "patient": 1000}
    assert SampleCodec(hooks).read(sample, 0)[2]["case_id"] == "1000"


def test_nan_pixels_in_the_probe_are_refused_naming_the_case(tmp_path):
    with pytest.raises(ValueError, match=r"probe images of case\(s\) \['c5'\] contain NaN or inf"):
        _fit(tmp_path, Net("logits"), Blobs(nan_at=5), [_mr(tmp_path)])


@pytest.mark.parametrize(
    "name", [n for n in P.available() if n != "adversarial"]
)  # adversarial needs a model
def test_nan_pixels_are_refused_by_every_perturbation_path(name):
    op = P.get(name, severity=2)
    c = 3 if name in P.available(channels=3) else 1  # the MRI / X-ray families take grey images
    x = torch.rand(3, c, 16, 16)
    x[2, 0, 4, 4] = float("nan")
    with pytest.raises(ValueError, match=rf"{name}: images contain NaN or inf \(batch index \[2\]\)"):
        op.apply_batch(x)
    img = np.random.default_rng(0).random((16, 16, c)).astype(np.float32)
    img[1, 1, c - 1] = np.inf
    with pytest.raises(ValueError, match=rf"{name}: image contains NaN or inf"):
        op.apply_numpy(img)


# ----------------------------------------------------------------------------- mask encodings
from robusttrain.cornercases import corners_report, find_corner_cases, select_balanced_epoch  # noqa: E402
from robusttrain.datamodules import ACDCDataModule, CXRDataModule, DataError, PolypDataModule  # noqa: E402
from robusttrain.datamodules.readers import FolderSource  # noqa: E402

SQUARE = (slice(4, 12), slice(6, 14))  # 8 x 8 = 64 foreground pixels


def _write_pair(root, stem, mask, ext=".png", size=(20, 24)):
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    img = np.full((*size, 3), 40, np.uint8)
    img[SQUARE] = 220
    cv2.imwrite(str(root / "images" / f"{stem}.png"), img)
    if ext in (".jpg", ".jpeg"):
        cv2.imwrite(str(root / "masks" / f"{stem}{ext}"), mask, [cv2.IMWRITE_JPEG_QUALITY, 75])
    else:
        cv2.imwrite(str(root / "masks" / f"{stem}{ext}"), mask)


def _mask(value, dtype=np.uint8, size=(20, 24)):
    m = np.zeros(size, dtype)
    m[SQUARE] = value
    return m


def _expected():
    m = np.zeros((20, 24), np.uint8)
    m[SQUARE] = 1
    return m


@pytest.mark.parametrize(
    ("value", "dtype", "ext", "mode"),
    [
        (1, np.uint8, ".png", "class_index"),  # 0/1 PNG: was thresholded at >127 -> empty
        (1, np.uint16, ".png", "class_index"),  # 16-bit class ids
        (255, np.uint8, ".png", "binary255"),
        (65535, np.uint16, ".png", "binary255"),  # 16-bit 0/65535
        (255, np.uint8, ".jpg", "binary255"),  # JPEG compression noise around 0/255 (Kvasir)
    ],
)
def test_mask_encodings_are_detected_and_decode_to_the_right_mask(tmp_path, value, dtype, ext, mode):
    for i in range(3):
        _write_pair(tmp_path, f"c{i}", _mask(value, dtype), ext)
    src = FolderSource(tmp_path)
    assert src.mask_mode == mode and "auto" in src.mask_mode_reason
    assert np.array_equal(src.load(0)[1], _expected())


def test_all_empty_masks_are_accepted_as_empty(tmp_path):
    _write_pair(tmp_path, "neg", _mask(0))
    src = FolderSource(tmp_path)
    assert src.load(0)[1].sum() == 0


@pytest.mark.parametrize(
    ("stray", "found"),
    [(7, r"0 \(415 px\), 1 \(64 px\), 7 \(1 px\)"), (255, r"0 \(415 px\), 1 \(64 px\), 255 \(1 px\)")],
)
def test_class_index_mask_with_a_stray_value_is_refused_naming_file_and_values(tmp_path, stray, found):
    m = _mask(1)
    m[0, 0] = stray
    _write_pair(tmp_path, "stray", m)
    with pytest.raises(
        DataError,
        match=rf"mask file .*stray\.png: values {found} fit neither mask encoding: "
        r"expected class indices 0\.\.1 \(mask_mode='class_index'\) or 0/255",
    ):
        FolderSource(tmp_path)


def test_mask_values_0_100_are_refused(tmp_path):
    _write_pair(tmp_path, "pct", _mask(100))
    with pytest.raises(DataError, match=r"pct\.png: values 0 \(416 px\), 100 \(64 px\) fit neither"):
        PolypDataModule(root=str(tmp_path), val_fraction=0.0).setup("fit")


def test_mixed_encodings_in_one_folder_are_refused_naming_both_files(tmp_path):
    _write_pair(tmp_path, "a_index", _mask(1))
    _write_pair(tmp_path, "b_binary", _mask(255))
    with pytest.raises(
        DataError,
        match=r"masks mix encodings: .*a_index\.png holds class indices but "
        r".*b_binary\.png is 0/255",
    ):
        FolderSource(tmp_path)


def test_file_disagreeing_with_the_configured_mode_names_the_fix(tmp_path):
    _write_pair(tmp_path, "ids", _mask(1))
    src = FolderSource(tmp_path, mask_mode="binary255")
    with pytest.raises(
        DataError,
        match=r"ids\.png: values 0 \(416 px\), 1 \(64 px\) look like class indices 0\.\.1, but this "
        r"dataset's masks are binary255 .*pass mask_mode='class_index'",
    ):
        src.load(0)


def test_class_index_masks_train_to_a_correct_dice(tmp_path):
    """0/1 PNG masks end to end: datamodule -> real trainer -> MR check: the exact detector scores Dice 1."""
    for i in range(6):
        _write_pair(tmp_path / "data", f"case{i}", _mask(1, size=(24, 24)), size=(24, 24))
    dm = PolypDataModule(
        root=str(tmp_path / "data"), image_size=24, batch_size=3, val_fraction=0.0, train_transforms=[]
    )
    trainer = quiet_trainer(max_epochs=1, callbacks=[_mr(tmp_path)], num_sanity_val_steps=0)
    trainer.fit(Net("logits"), datamodule=dm)
    assert dm.mask_encoding == "class_index"
    h = pd.read_csv(tmp_path / "history.csv")
    assert len(h) == 6 and (h["dice_polyp"] == 1.0).all()


# ----------------------------------------------------------------------------- truncated files
def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_truncated_jpeg_image_is_refused_naming_the_file(tmp_path):
    _write_pair(tmp_path, "ok", _mask(255))
    rng = np.random.default_rng(0)
    cv2.imwrite(str(tmp_path / "images" / "cut.jpg"), rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    cv2.imwrite(str(tmp_path / "masks" / "cut.png"), _mask(255, size=(64, 64)))
    _truncate(tmp_path / "images" / "cut.jpg")
    src = FolderSource(tmp_path)
    with pytest.raises(DataError, match=r"image file .*cut\.jpg is a truncated or corrupt JPEG"):
        src.load([src.case_id(i) for i in range(len(src))].index("cut"))


def test_truncated_jpeg_mask_is_refused_naming_the_file(tmp_path):
    rng = np.random.default_rng(0)
    m = (rng.random((64, 64)) > 0.5).astype(np.uint8) * 255
    _write_pair(tmp_path, "cutmask", m, ".jpg", size=(64, 64))
    _truncate(tmp_path / "masks" / "cutmask.jpg", 0.6)
    with pytest.raises(DataError, match=r"cutmask\.jpg is a truncated or corrupt JPEG"):
        FolderSource(tmp_path)


def test_jpeg_with_bytes_after_the_end_marker_still_loads(tmp_path):
    _write_pair(tmp_path, "tail", _mask(255), ".jpg")
    cv2.imwrite(str(tmp_path / "images" / "tail.jpg"), np.full((20, 24, 3), 90, np.uint8))
    (tmp_path / "images" / "tail.png").unlink()
    with open(tmp_path / "images" / "tail.jpg", "ab") as f:
        f.write(b"trailer written by a camera")
    img, mask = FolderSource(tmp_path).load(0)
    assert img.shape == (20, 24, 3) and int(img.mean()) in (89, 90, 91) and mask.sum() == 64


# ----------------------------------------------------------------------------- config at construction
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"image_size": 0}, r"PolypDataModule: image_size=0: expected an integer >= 1"),
        ({"image_size": "big"}, r"image_size='big': expected an integer >= 1"),
        ({"batch_size": 0}, r"PolypDataModule: batch_size=0: expected an integer >= 1"),
        ({"num_workers": -1}, r"num_workers=-1: expected an integer >= 0"),
        ({"val_fraction": 1.5}, r"val_fraction=1.5: expected a number in \[0, 1\)"),
        ({"val_fraction": -0.1}, r"val_fraction=-0.1: expected a number in \[0, 1\)"),
        ({"hard_fraction": 2}, r"hard_fraction=2: expected a number in \[0, 1\]"),
        ({"n_train": 0}, r"n_train=0: expected an integer >= 1"),
        ({"resize": "crop"}, r"resize='crop': expected one of 'stretch', 'letterbox', 'none'"),
        (
            {"mask_mode": "threshold"},
            r"mask_mode='threshold': expected one of 'auto', 'binary255', 'class_index'",
        ),
        ({"cache_mb": -1}, r"cache_mb=-1: expected a number >= 0"),
        ({"pin_memory": "yes"}, r"pin_memory='yes': expected true or false"),
        (
            {"train_transforms": [{"_target_": "albumentations.NoSuchFlip"}]},
            r"PolypDataModule: train_transforms: transform config: cannot import 'albumentations.NoSuchFlip'",
        ),
        (
            {"train_transforms": [{"_target_": "albumentations.Resize"}]},
            r"PolypDataModule: train_transforms: transform config albumentations.Resize: height: Field required; "
            r"width: Field required",
        ),
    ],
)
def test_bad_datamodule_values_fail_at_construction(kw, message):
    with pytest.raises(ValueError, match=message):
        PolypDataModule(**kw)


def test_missing_root_and_extra_val_fail_at_construction_naming_the_key(tmp_path):
    with pytest.raises(
        DataError, match=rf"CXRDataModule: root='{re.escape(str(tmp_path))}/nope': folder does not exist"
    ):
        CXRDataModule(root=str(tmp_path / "nope"))
    with pytest.raises(
        DataError, match=r"ACDCDataModule: extra_val\['etis'\]='/no/such/etis': folder does not exist"
    ):
        ACDCDataModule(extra_val={"etis": "/no/such/etis"})


# ----------------------------------------------------------------------------- corner-case analysis
def _history(value=None, col="dice_lv", case="p3", epoch=1):
    rows = [
        {"case_id": f"p{c}", "epoch": e, "dice_lv": 0.8 + 0.01 * c, "dice_rv": 0.7}
        for c in range(6)
        for e in range(3)
    ]
    h = pd.DataFrame(rows)
    if value is not None:
        h[col] = h[col].astype(object)
        h.loc[(h["case_id"] == case) & (h["epoch"] == epoch), col] = value
    return h


@pytest.mark.parametrize("value", [float("inf"), -5.0, 1.2, "n/a"])
def test_impossible_dice_values_are_refused_naming_column_case_epoch(value):
    h = _history(value)
    msg = rf"history column 'dice_lv' has value {re.escape(repr(value))} for case 'p3' at epoch 1; expected a score in \[0, 1\]"
    with pytest.raises(ValueError, match=msg):
        find_corner_cases(h)
    with pytest.raises(ValueError, match=msg):
        select_balanced_epoch(h)


def test_impossible_iou_in_a_history_csv_is_refused_by_the_report(tmp_path):
    h = _history()
    h["iou_lv"] = 0.5
    h.loc[4, "iou_lv"] = -0.25
    h.to_csv(tmp_path / "history.csv", index=False)
    with pytest.raises(ValueError, match=r"history column 'iou_lv' has value -0.25 for case 'p1' at epoch 1"):
        corners_report(tmp_path)


def test_missing_dice_is_skipped_not_refused():
    res = find_corner_cases(_history(float("nan"), epoch=2))
    assert res.ok and res.skipped == ["p3"]


@pytest.mark.parametrize("contamination", [0.7, 0.0, -0.1, "abc", float("nan")])
def test_contamination_outside_pyod_range_is_refused(contamination):
    with pytest.raises(
        ValueError,
        match=rf"contamination={re.escape(repr(contamination))}: expected a number in "
        r"\(0, 0\.5\]",
    ):
        select_balanced_epoch(_history(), contamination=contamination)


def test_unknown_policy_is_refused_with_the_choices():
    with pytest.raises(
        ValueError, match=r"policy='best': expected one of 'last_inlier', 'maximin', 'pareto', 'cvar'"
    ):
        select_balanced_epoch(_history(), policy="best")
    with pytest.raises(
        ValueError, match=r"policy='best': expected one of 'last_inlier', 'maximin', 'pareto', 'cvar'"
    ):
        BalancedCheckpoint(policy="best")


@pytest.mark.slow
def test_cli_fit_with_diverging_weights_stops_with_one_line_and_no_checkpoint_choice(tmp_path, capsys):
    from robusttrain.cli import main

    rc = main(
        [
            "fit",
            "recipe=smoke",
            f"run_dir={tmp_path}",
            "model.lr=1e30",
            "trainer.max_epochs=1",
            "callbacks.reporting.enabled=false",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert re.fullmatch(
        r"robusttrain fit: error: model outputs \(logits\) contain NaN or inf at epoch 0 on the "
        r"'val' probe \(cases \['synpolyp_00\d\d', .*\] and \d+ more\): the robustness check "
        r"stops here \(no EFR, corner cases or checkpoint choice from them\)",
        err[-1],
    )
    assert not (tmp_path / "balanced.ckpt").exists() and not (tmp_path / "efr.csv").exists()
