"""MRI and X-ray families: bad input, size-free params, physics, suites by name, and severity order on real
ACDC slices / Shenzhen radiographs. Parity, replay, masks and batching: perturbations/test_conformance.py."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import robusttrain.perturbations as P
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.perturbations import get
from robusttrain.perturbations.suites import SUITES, resolve

MRI = ["bias_field", "ghosting", "gibbs", "spike", "rician_noise", "gamma"]
XRAY = ["quantum_noise", "exposure", "xray_markers", "collimation"]
NEW = MRI + XRAY
GREY_ONLY = [n for n in NEW if n not in ("gamma", "exposure")]  # tone curves apply per channel on RGB too
TOL = 2 / 255 + 1e-6


def _phantoms(b: int = 2, h: int = 96, w: int = 80, seed: int = 0):
    """Grey uint8 slices (non-square, to catch swapped axes): a bright ellipse with an inner ring and
    mild noise on a dark background, and a mask of the ring."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    imgs, masks = [], []
    for i in range(b):
        r = ((yy - h / 2) / (0.38 * h)) ** 2 + ((xx - w / 2 - 2 * i) / (0.4 * w)) ** 2
        img = 30 + 150 * (r < 1) + 50 * ((r > 0.2) & (r < 0.35)) + rng.normal(0, 4, (h, w))
        imgs.append(np.clip(img, 0, 255).astype(np.uint8))
        masks.append(((r > 0.2) & (r < 0.35)).astype(np.int64))
    return imgs, masks


def _batch(imgs):
    return torch.from_numpy(np.stack(imgs))[:, None].float() / 255


def test_registry_channels_and_suites():
    for n in NEW:
        assert n in P.available() and n in P.available(channels=1)
        assert (n in P.available(channels=3)) == (n not in GREY_ONLY), n
    assert "saturation" in P.available(channels=3) and "saturation" not in P.available(channels=1)
    assert {"blur", "contrast"} <= set(P.available(channels=1)) & set(P.available(channels=3))
    with pytest.raises(ValueError, match="channels must be 1 or 3"):
        P.available(channels=2)
    assert resolve("mri") == list(SUITES["mri"]) and resolve("endoscopy")[0] == "saturation"
    assert resolve(["xray", "motion_blur", "blur"]) == list(SUITES["xray"]) + ["motion_blur"]
    with pytest.raises(
        ValueError, match="unknown perturbation suite 'ct'; valid suites: endoscopy, mri, xray, shift"
    ):
        resolve("ct")
    with pytest.raises(ValueError, match="unknown perturbation 'sparkle'.*valid suites"):
        MRSuite(["blur", "sparkle"])
    with pytest.raises(ValueError, match="unknown perturbation suite 'MRI'"):
        MRSuite("MRI")


@pytest.mark.parametrize(("suite", "channels"), [("mri", 1), ("xray", 1), ("endoscopy", 3)])
def test_each_suite_runs_entirely_on_its_modality(suite, channels):
    s = MRSuite(suite, severities=(2,))
    s.prepare(in_channels=channels)
    assert not s.skipped and len(s.tests) == len(SUITES[suite]) >= 6


def test_grey_suites_skip_on_rgb_with_a_reason():
    s = MRSuite("mri", severities=(2,))
    s.prepare(in_channels=3)
    assert set(s.skipped) == set(MRI) - {"gamma"}
    assert all("single-channel" in r for r in s.skipped.values())
    assert [n for n, _ in s.tests] == ["gamma", "blur", "contrast"]


@pytest.mark.parametrize("name", ["xray_markers", "collimation"])
@pytest.mark.parametrize("planes", [True, False], ids=["cpu-planes", "torch-kernels"])
def test_overlays_keep_off_the_labelled_anatomy(name, planes):
    imgs, masks = _phantoms(b=2, h=128, w=128, seed=4)
    for mk in masks:  # a large lung-like mask reaching near the borders
        mk[10:118, 14:114] = 1
    x, m = _batch(imgs), torch.from_numpy(np.stack(masks))
    p = get(name, severity=5)
    p.cpu_planes = planes
    for seed in range(4):
        out, _ = p.apply_batch(x, m, generator=torch.Generator().manual_seed(seed))
        les = (m != 0)[:, None]
        assert torch.equal(out[les], x[les]), name
        assert (out != x).any()
        o, _ = p.apply_numpy(imgs[0], masks[0], rng=np.random.default_rng(seed))
        assert np.array_equal(o[masks[0] != 0], imgs[0][masks[0] != 0])


@pytest.mark.parametrize("name", GREY_ONLY)
def test_colour_input_is_refused_with_one_clear_message(name):
    p = get(name, severity=2)
    rgb = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(ValueError, match=rf"{name}: needs single-channel \(grey\).*shape \(32, 32, 3\)"):
        p.apply_numpy(rgb)
    with pytest.raises(ValueError, match=rf"{name}: needs single-channel \(grey\).*\(B,1,H,W\).*3 channels"):
        p.apply_batch(torch.zeros(2, 3, 32, 32))
    with pytest.raises(ValueError, match="single-channel"):
        p.sample_params(torch.zeros(2, 3, 32, 32))
    with pytest.raises(ValueError, match="must lie in \\[0,1\\]"):
        p.apply_batch(torch.full((1, 1, 8, 8), 2.0))
    with pytest.raises(ValueError, match="severity must be an int in 1..5"):
        get(name, severity=6)
    good, params = p.apply_batch(torch.rand(2, 1, 16, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="leading dim B=3"):
        p.apply_batch(torch.rand(3, 1, 16, 16), params=params)


@pytest.mark.parametrize("name", ["bias_field", "spike", "gamma", "exposure", "collimation", "gibbs"])
def test_params_replay_at_another_size(name):
    # Params are size-free: drawn at 64 px, replayed at 128 px and shrunk back, they give the same image.
    imgs, _ = _phantoms(b=1, h=64, w=64, seed=5)
    small = _batch(imgs)
    big = torch.nn.functional.interpolate(small, scale_factor=2, mode="bilinear", align_corners=False)
    p = get(name, severity=3)
    out_small, params = p.apply_batch(small, generator=torch.Generator().manual_seed(0))
    out_big, _ = p.apply_batch(big, params=params)
    back = torch.nn.functional.avg_pool2d(out_big, 2)
    ref = torch.nn.functional.avg_pool2d(big, 2)  # the input round trip, for scale
    err = float((back - out_small).abs().mean())
    assert err < float((ref - small).abs().mean()) + 2.5 / 255, (name, err * 255)


def test_kspace_families_behave_like_their_physics():
    imgs, _ = _phantoms(b=1, h=64, w=64)
    x = _batch(imgs)
    # Gibbs keeps only the central band: the output spectrum is zero outside it
    p = get("gibbs", severity=5)
    params = {"keep": torch.tensor([[0.25, 0.5]])}
    out, _ = p.apply_batch(x, params=params)
    assert float((out - x).abs().mean()) > 2 / 255
    # ghosting: copies shifted by H / ghosts along the chosen axis -> the background above/below brightens
    g = get("ghosting", severity=5)
    gy, _ = g.apply_batch(
        x, params={"ghosts": torch.tensor([2]), "axis": torch.tensor([0]), "intensity": torch.tensor([0.4])}
    )
    gx, _ = g.apply_batch(
        x, params={"ghosts": torch.tensor([2]), "axis": torch.tensor([1]), "intensity": torch.tensor([0.4])}
    )
    top = slice(0, 6)
    assert float(gy[0, 0, top, 28:36].mean()) > float(x[0, 0, top, 28:36].mean()) + 10 / 255
    assert float(gx[0, 0, 28:36, top].mean()) > float(x[0, 0, 28:36, top].mean()) + 10 / 255
    # spike: a plane wave of the requested frequency (cycles per image)
    s = get("spike", severity=3)
    flat = torch.full((1, 1, 64, 64), 0.5)
    sp = {
        "freq": torch.tensor([[[0.0, 8.0], [0.0, 0.0]]]),
        "phase": torch.zeros(1, 2),
        "amplitude": torch.tensor([[0.2, 0.0]]),
        "white": torch.tensor([0.5]),
    }
    o, _ = s.apply_batch(flat, params=sp)
    row = o[0, 0, 0] - 0.5
    spec = torch.fft.rfft(row).abs()
    assert int(spec.argmax()) == 8 and abs(float(spec[8]) / 32 - 0.1) < 1e-3  # amplitude * white level


# --------------------------------------------------------------------------------------
# real data: severity order
# --------------------------------------------------------------------------------------
def _acdc_slices(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    import h5py  # a declared dependency: a missing one is a broken install, not a skip

    files = sorted((root / "acdc" / "volumes").glob("*.h5"))[:6]
    if not files:
        pytest.skip("no ACDC volumes in shared data")
    imgs, labs = [], []
    for f in files:
        with h5py.File(f) as h:
            k = h["image"].shape[0] // 2  # a mid-ventricular slice
            img, lab = h["image"][k], h["label"][k]
        imgs.append(
            cv2.resize(np.clip(img, 0, 1).astype(np.float32), (128, 128), interpolation=cv2.INTER_AREA)
        )
        labs.append(cv2.resize(lab, (128, 128), interpolation=cv2.INTER_NEAREST))
    return torch.from_numpy(np.stack(imgs))[:, None], torch.from_numpy(np.stack(labs).astype(np.int64))


def _cxr_frames(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    files = sorted((root / "shenzhen_cxr" / "images").glob("*.jpg"))[:6]
    if not files:
        pytest.skip("no Shenzhen CXR frames in shared data")
    imgs, masks = [], []
    for f in files:
        img = cv2.imread(str(f), cv2.IMREAD_GRAYSCALE)
        mk = cv2.imread(str(f.parent.parent / "masks" / f.name), cv2.IMREAD_GRAYSCALE)
        imgs.append(cv2.resize(img, (256, 256), interpolation=cv2.INTER_AREA))
        masks.append(cv2.resize((mk > 127).astype(np.uint8), (256, 256), interpolation=cv2.INTER_NEAREST))
    x = torch.from_numpy(np.stack(imgs))[:, None].float() / 255
    return x, torch.from_numpy(np.stack(masks).astype(np.int64))


def _effects(name, x, m):
    """Mean |out - x| (grey levels) at severities 1..5, averaged over 3 seeds; and, at severity 1, the
    smallest over images of (largest change / the image's white level) — "visible on every image"."""
    white = torch.quantile(x.flatten(1), 0.99, dim=1)
    means, peak1 = [], np.inf
    for s in range(1, 6):
        d = []
        for seed in range(3):
            out, _ = get(name, severity=s).apply_batch(x, m, generator=torch.Generator().manual_seed(seed))
            diff = (out - x).abs()
            d.append(float(diff.mean()) * 255)
            if s == 1:
                peak1 = min(peak1, float((diff.amax(dim=(1, 2, 3)) / white).min()))
        means.append(float(np.mean(d)))
    return means, peak1


@pytest.mark.shared_data
@pytest.mark.parametrize("name", MRI)
def test_mri_severity_monotone_on_acdc(shared_data, name):
    x, m = _acdc_slices(shared_data)
    means, peak1 = _effects(name, x, m)
    assert all(b > a for a, b in zip(means, means[1:])), (name, means)
    assert peak1 >= 0.03, f"{name}@1 is not visible on every slice (max change {100 * peak1:.1f} % of white)"


@pytest.mark.shared_data
@pytest.mark.parametrize("name", XRAY)
def test_xray_severity_monotone_on_shenzhen(shared_data, name):
    x, m = _cxr_frames(shared_data)
    means, peak1 = _effects(name, x, m)
    assert all(b > a for a, b in zip(means, means[1:])), (name, means)
    assert peak1 >= 0.03, f"{name}@1 is not visible on every frame (max change {100 * peak1:.1f} % of white)"


def test_recipes_use_the_modality_suites():
    from robusttrain.cli.compose import compose_recipe

    for recipe, suite in (("acdc", "mri"), ("cxr", "xray")):
        cfg = compose_recipe(recipe, [])
        assert cfg.callbacks.metamorphic.suite.perturbations == suite
        s = MRSuite(cfg.callbacks.metamorphic.suite.perturbations, severities=(2,))
        s.prepare(in_channels=int(cfg.model.in_channels))
        assert len(s.tests) >= 6 and not s.skipped


@pytest.mark.parametrize("name", NEW + ["contrast"])
def test_non_contiguous_batches_match_contiguous(name):
    # e.g. volume slices as a permuted view (B,1,H,W,D) -> (B*D,1,H,W): the per-plane path must not
    # inherit the input's strides
    imgs, _ = _phantoms(b=4)
    x = _batch(imgs)
    view = x.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2)  # same values, column-major planes
    assert not view.is_contiguous()
    p = get(name, severity=3)
    out, params = p.apply_batch(x, generator=torch.Generator().manual_seed(0))
    again, _ = p.apply_batch(view, params=params)
    assert torch.equal(out, again)


def test_mri_suite_on_a_volume_slice_by_slice():
    # a (B,1,H,W,D) cine stack: every family runs on each slice with its volume's params, both paths agree
    imgs, _ = _phantoms(b=4, h=48, w=40)
    vol = _batch(imgs)[:, 0].permute(1, 2, 0)[None, None].contiguous()  # (1,1,H,W,D=4)
    s = MRSuite("mri", severities=(3,), seed=0)
    s.prepare(in_channels=1, probe=vol)
    assert len(s.tests) == len(SUITES["mri"])
    for k, (name, _) in enumerate(s.tests):
        params = s.params_for("val", k, ["v0"], [0], vol)
        t = s.apply(k, vol, None, params, path="torch")
        n = s.apply(k, vol, None, params, path="numpy")
        assert t.shape == vol.shape and float((t - n).abs().max()) <= TOL, name
        assert not torch.equal(t, vol), name


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "suite"), [("acdc", "mri"), ("cxr", "xray")])
def test_recipe_fit_checks_its_modality_suite(tmp_path, recipe, suite):
    # a real (tiny) Lightning fit through the CLI: every family of the suite is checked, none skipped
    import csv

    from robusttrain.cli import main

    run_dir = tmp_path / recipe
    code = main(
        [
            "fit",
            f"recipe={recipe}",
            f"run_dir={run_dir}",
            "trainer.max_epochs=1",
            "data.n_train=8",
            "data.n_val=4",
            "data.image_size=64",
            "callbacks.metamorphic.max_cases=4",
            "callbacks.mining.train_probe_size=4",
            "callbacks.metamorphic.suite.severities=[3]",
            "trainer.enable_progress_bar=false",
            "logger=none",
        ]
    )
    assert code == 0
    with open(run_dir / "efr.csv") as f:
        checked = {row["perturbation"] for row in csv.DictReader(f)}
    assert set(SUITES[suite]) <= checked and len(SUITES[suite]) >= 6
