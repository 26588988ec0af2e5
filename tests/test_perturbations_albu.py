"""Albumentations integration, user cut-out folders (real EAD2019 instrument mask) and the gallery."""
from __future__ import annotations

from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import pytest

import robusttrain.perturbations as P
from robusttrain.perturbations import albu, get
from robusttrain.perturbations.cutouts import SIZE, load_cutouts
from robusttrain.perturbations.gallery import render_gallery

EAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "ead2019_artefacts"


def _img(h=96, w=96, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    img = np.stack([170 + 40 * np.sin(xx / 8), 90 + 30 * np.cos(yy / 6), 70 + 0 * xx], -1) + rng.normal(0, 5, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _mask(h=96, w=96):
    m = np.zeros((h, w), np.uint8)
    m[40:60, 40:60] = 1
    return m


@pytest.mark.parametrize("family", sorted(albu.TRANSFORMS))
def test_each_family_in_compose_uint8_and_float_and_roundtrips_dict(family):
    img, m = _img(), _mask()
    t = A.Compose([albu.TRANSFORMS[family](severity=4, p=1.0)], seed=3)
    out = t(image=img, mask=m)
    assert out["image"].dtype == np.uint8 and out["image"].shape == img.shape
    assert np.array_equal(out["mask"], m)
    if family in ("specularity", "instrument", "feces", "blood", "text", "melt"):
        assert np.array_equal(out["image"][m != 0], img[m != 0])  # the lesion is left alone
    else:
        assert not np.array_equal(out["image"], img)
    f = t(image=img.astype(np.float32) / 255, mask=m)["image"]
    assert f.dtype == np.float32 and 0 <= f.min() and f.max() <= 1
    t2 = A.from_dict(A.to_dict(t))
    assert type(t2.transforms[0]) is albu.TRANSFORMS[family] and t2.transforms[0].severity == 4
    # same seed, same pipeline from the dict -> same output
    t2 = A.Compose(t2.transforms, seed=3)
    assert np.array_equal(A.Compose([albu.TRANSFORMS[family](severity=4)], seed=3)(image=img, mask=m)["image"],
                          t2(image=img, mask=m)["image"])


def test_replaycompose_replays_exactly_and_mixes_with_builtins():
    img, m = _img(), _mask()
    r = A.ReplayCompose([albu.SpecularityTransform(severity=5), A.HorizontalFlip(p=1.0),
                         albu.BlurTransform(severity=2), albu.TextTransform(severity=3)])
    r.set_random_seed(0)
    out = r(image=img, mask=m)
    again = A.ReplayCompose.replay(out["replay"], image=img, mask=m)
    assert np.array_equal(out["image"], again["image"])
    assert np.array_equal(out["mask"], m[:, ::-1])  # only the flip touches the mask


def test_bad_options_and_severity_rejected_by_schema():
    with pytest.raises(ValueError):
        albu.BlurTransform(severity=9)
    with pytest.raises(ValueError, match="no Albumentations transform"):
        get("adversarial", model=lambda x: x).to_albumentations()


def test_to_albumentations_reuses_configuration():
    t = get("white_balance", severity=2, cast="purple").to_albumentations(p=1.0)
    assert isinstance(t, albu.WhiteBalanceTransform) and t.options == {"cast": "purple"}
    d = A.to_dict(A.Compose([t]))
    assert A.from_dict(d).transforms[0].perturbation.cast == "purple"


@pytest.mark.shared_data
@pytest.mark.skipif(not EAD.is_dir(), reason="../shared/data/ead2019_artefacts not present")
def test_real_instrument_cutout_from_ead2019_folder():
    cuts = load_cutouts(EAD, mask_channel=0)  # images/ + masks/*_mask.tif (5-channel TIFF)
    assert len(cuts) == 1 and cuts[0].shape == (SIZE, SIZE, 4)
    assert 0.1 < cuts[0][:, :, 3].mean() < 0.9
    p = get("instrument", severity=4, cutouts=EAD)
    img, m = _img(256, 256), np.zeros((256, 256), np.int64)
    m[100:140, 100:140] = 1
    out, params = p.apply_numpy(img, m, rng=np.random.default_rng(0))
    assert params["visible"] == 1 and (out != img).any()
    assert np.array_equal(out[m != 0], img[m != 0])
    t = A.Compose([albu.InstrumentTransform(severity=3, options={"cutouts": str(EAD)})], seed=0)
    assert A.from_dict(A.to_dict(t)).transforms[0].perturbation.cutouts == str(EAD)


def test_user_folder_rgba_and_pairs(tmp_path):
    rgba = np.zeros((40, 60, 4), np.uint8)
    rgba[10:30, 10:50] = (40, 200, 90, 255)
    cv2.imwrite(str(tmp_path / "a.png"), rgba)
    img = np.full((50, 50, 3), 128, np.uint8)
    mask = np.zeros((50, 50), np.uint8)
    mask[5:45, 20:30] = 255
    cv2.imwrite(str(tmp_path / "b.jpg"), img)
    cv2.imwrite(str(tmp_path / "b_mask.png"), mask)
    cv2.imwrite(str(tmp_path / "c.jpg"), img)  # no mask: ignored
    cuts = load_cutouts(tmp_path)
    assert len(cuts) == 2
    assert cuts[0][SIZE // 2, SIZE // 2, 3] > 0.9  # object centred, opaque
    assert abs(cuts[0][SIZE // 2, SIZE // 2, 1] - 200 / 255) < 0.02  # RGB order (BGR file read correctly)


def test_empty_or_missing_cutout_folder_errors(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="no usable files; expected RGBA PNGs"):
        get("feces", cutouts=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        get("blood", cutouts=tmp_path / "nope")


def test_gallery_grid(tmp_path):
    imgs = [_img(80, 80, 0), _img(80, 80, 1)]
    path = render_gallery(imgs, tmp_path / "g.png", names=["blur", "text", "instrument"], severities=(1, 3, 5), tile=64)
    grid = cv2.imread(str(path))
    assert grid.shape == (2 * 3 * 64, 4 * 64, 3)
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, no temp left
    with pytest.raises(ValueError, match="HWC uint8 RGB"):
        render_gallery([np.zeros((8, 8), np.float32)], tmp_path / "bad.png")
    assert set(P.available()) >= {"blur", "text", "instrument"}
