"""Perturbation library: registry, lesion and border semantics, colour / blur / melt behaviour, bad input.
The contract every family follows (parity, replay, masks, batching, NaN, severity) is checked once for all
families in perturbations/test_conformance.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import robusttrain.perturbations as P
from robusttrain.perturbations import fov_mask, fov_mask_np, get

SPATIAL = ["specularity", "instrument", "feces", "blood", "text", "melt"]


def _frames(b: int = 2, h: int = 96, w: int = 96, border: bool = True, seed: int = 0):
    """Endoscopy-like uint8 frames: smooth reddish texture, a few highlights, an octagonal black border,
    and a square lesion mask."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    imgs, masks = [], []
    for i in range(b):
        base = np.stack(
            [180 + 40 * np.sin(xx / 9 + i), 90 + 30 * np.cos(yy / 7), 70 + 20 * np.sin((xx + yy) / 11)], -1
        )
        img = np.clip(base + rng.normal(0, 6, base.shape), 0, 255)
        img[rng.integers(10, h - 10, 6), rng.integers(10, w - 10, 6)] = 255  # highlights for melt
        if border:
            cut = np.abs(yy - h / 2) + np.abs(xx - w / 2) > 0.9 * (h + w) / 2 * 0.75
            img[cut] = 2
        m = np.zeros((h, w), np.int64)
        m[h // 2 - 4 + 2 * i : h // 2 + 8, w // 2 - 8 : w // 2 + 8] = 1
        imgs.append(img.astype(np.uint8))
        masks.append(m)
    return imgs, masks


def _batch(imgs):
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float() / 255


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))


def test_registry_lists_all_families_and_rejects_unknown():
    for n in (
        "saturation",
        "contrast",
        "white_balance",
        "specularity",
        "blur",
        "instrument",
        "feces",
        "blood",
        "text",
        "melt",
        "adversarial",
        "motion_blur",
    ):
        assert n in P.available()
    with pytest.raises(ValueError, match="unknown perturbation 'sparkle'.*saturation"):
        get("sparkle")


def test_generator_seeds_differ():
    imgs, _ = _frames()
    x = _batch(imgs)
    p = get("blur", severity=3)
    _, p1 = p.apply_batch(x, generator=torch.Generator().manual_seed(1))
    _, p2 = p.apply_batch(x, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(p1["sigma_rel"], p2["sigma_rel"])
    assert p1["sigma_rel"][0] != p1["sigma_rel"][1]  # per-sample params


@pytest.mark.parametrize("name", SPATIAL)
def test_lesion_never_covered_and_mask_unchanged(name):
    imgs, masks = _frames(b=3, seed=1)
    x, m = _batch(imgs), torch.from_numpy(np.stack(masks))
    m_before = m.clone()
    p = get(name, severity=5)
    for seed in range(3):
        out, _ = p.apply_batch(x, m, generator=torch.Generator().manual_seed(seed))
        les = (m != 0)[:, None].expand_as(x)
        assert torch.equal(out[les], x[les]), name
        for i in range(3):
            mi = masks[i].copy()
            o, _ = p.apply_numpy(imgs[i], mi, rng=np.random.default_rng(seed))
            assert np.array_equal(o[mi != 0], imgs[i][mi != 0])
            assert np.array_equal(mi, masks[i])
    assert torch.equal(m, m_before)


def test_objects_avoid_a_large_lesion_by_placement():
    # the lesion fills the left half: objects must go to the right half
    imgs, _ = _frames(b=2, border=False)
    m = np.zeros((96, 96), np.int64)
    m[:, :48] = 1
    p = get("feces", severity=2)
    out, params = p.apply_batch(
        _batch(imgs), torch.from_numpy(np.stack([m, m])), generator=torch.Generator().manual_seed(0)
    )
    assert bool((params["center_rel"][:, 1] > 0.5).all())


@pytest.mark.parametrize("name", ["specularity", "instrument", "feces", "blood", "melt"])
def test_nothing_drawn_on_black_border(name):
    imgs, masks = _frames(b=2, seed=2)
    x = _batch(imgs)
    fov = fov_mask(x)
    assert 0.3 < float(fov.float().mean()) < 0.95
    p = get(name, severity=5)
    for seed in range(3):
        out, _ = p.apply_batch(x, generator=torch.Generator().manual_seed(seed))
        border = (~fov).expand_as(x)
        assert torch.equal(out[border], x[border]), name


def test_fov_mask_paths_agree_and_ignore_dark_lumen():
    imgs, _ = _frames(b=1, h=128, w=160)
    img = imgs[0].copy()
    img[60:70, 75:85] = 0  # a dark lumen inside the view is not border
    t = _batch([img])
    a, b = fov_mask(t)[0, 0].numpy(), fov_mask_np(img)
    assert np.array_equal(a, b)
    assert a[64, 80] and not a[0, 0]
    assert fov_mask_np(np.full((32, 32, 3), 120, np.uint8)).all()


def test_colour_semantics():
    img = np.full((8, 8, 3), (150, 100, 80), np.uint8)
    wb, _ = get("white_balance", severity=5, cast="green").apply_numpy(img, rng=np.random.default_rng(0))
    assert wb[0, 0, 1] == 100 and wb[0, 0, 0] < 90 and wb[0, 0, 2] < 50
    wp, _ = get("white_balance", severity=5, cast="purple").apply_numpy(img, rng=np.random.default_rng(0))
    assert wp[0, 0, 2] == 80 and wp[0, 0, 1] < 60
    s, _ = get("saturation", severity=5).apply_numpy(img, rng=np.random.default_rng(0))
    assert int(s[0, 0, 0]) - int(s[0, 0, 2]) > 70  # channels spread apart
    c, _ = get("contrast", severity=5).apply_numpy(img, rng=np.random.default_rng(0))
    assert c.astype(int).sum() < img.astype(int).sum()


@pytest.mark.parametrize("name", ["saturation", "contrast", "white_balance"])
def test_colour_numpy_fast_path_is_the_generic_formula_bit_for_bit(name):
    """The colour families' scalar numpy sampler and matrix give exactly the generic ones: _draw through
    NumpyRandom (same params from the same stream, same dtypes) and _affine on one-sample arrays (same
    matrix bits), for uint8 / float32 / grey images and for params replayed from the torch path."""
    from robusttrain.perturbations.base import NumpyRandom, Perturbation, index_params
    from robusttrain.perturbations.colour import _AffineColour

    imgs, masks = _frames(b=1)
    rgb = imgs[0]
    images = [rgb, rgb.astype(np.float32) / 255] + ([rgb[:, :, :1]] if name == "contrast" else [])
    kws = [{}, {"cast": "green"}, {"cast": "purple"}] if name == "white_balance" else [{}]
    for kw in kws:
        for sev in (1, 2, 3, 4, 5):
            p = get(name, severity=sev, **kw)
            for img in images:
                for seed in range(25):
                    fast = p._sample_np(img, masks[0], np.random.default_rng(seed))
                    generic = Perturbation._sample_np(p, img, masks[0], np.random.default_rng(seed))
                    assert list(fast) == list(generic)
                    for k in fast:
                        assert np.asarray(fast[k]).dtype == np.asarray(generic[k]).dtype
                        assert np.array_equal(fast[k], generic[k]), (sev, kw, seed, k)
                    scale = 255.0 if img.dtype == np.uint8 else 1.0
                    a = p._affine_np(fast, img.shape[2], scale)
                    assert a == _AffineColour._affine_np(p, fast, img.shape[2], scale)
            torch_params = p.sample_params(_batch(imgs * 3), generator=torch.Generator().manual_seed(sev))
            for i in range(3):
                q = index_params(torch_params, i)  # 0-d arrays, as a replay hands them over
                assert p._affine_np(q, 3, 255.0) == _AffineColour._affine_np(p, q, 3, 255.0)
    assert NumpyRandom(np.random.default_rng(0)).uniform(0.0, 1.0, (1,)).dtype == np.float32


def test_severity_orders_strength():
    imgs, _ = _frames(b=4)
    x = _batch(imgs)
    for name in ("blur", "saturation", "contrast", "white_balance", "motion_blur"):
        d = [
            float(
                (get(name, severity=s).apply_batch(x, generator=torch.Generator().manual_seed(0))[0] - x)
                .abs()
                .mean()
            )
            for s in (1, 5)
        ]
        assert d[1] > d[0], name


def test_blur_fast_mode_is_close_and_sigma_relative():
    imgs, _ = _frames(b=1, h=512, w=512, border=False)
    exact, fast = get("blur", severity=5, noise=False), get("blur", severity=5, fast=True, noise=False)
    params = exact.sample_numpy(imgs[0], rng=np.random.default_rng(0))
    assert 8 / 512 <= params["sigma_rel"] <= 15 / 512  # relative: 8-15 px on a 512-px image
    a, _ = exact.apply_numpy(imgs[0], params=params)
    b, _ = fast.apply_numpy(imgs[0], params=params)
    assert np.abs(a.astype(float) - b).mean() < 1.0


def test_adversarial_increases_loss_and_respects_eps():
    model = _model()
    imgs, masks = _frames()
    x, m = _batch(imgs), torch.from_numpy(np.stack(masks))
    adv = get("adversarial", severity=5, model=model)
    out, params = adv.apply_batch(x, m)
    assert float((out - x).abs().max()) <= 8 / 255 + 1e-6
    ce = torch.nn.functional.cross_entropy
    with torch.no_grad():
        assert ce(model(out), m) > ce(model(x), m)
    with pytest.raises(ValueError, match="needs the model"):
        get("adversarial")


def test_melt_removes_highlights_and_keeps_lesion():
    img = np.full((64, 64, 3), (170, 90, 80), np.uint8)
    img[20:24, 20:24] = 255
    img[40:44, 40:44] = 255
    mask = np.zeros((64, 64), np.int64)
    mask[38:46, 38:46] = 1
    out, _ = get("melt", severity=3).apply_numpy(img, mask, rng=np.random.default_rng(0))
    assert out[21, 21, 1] < 150  # the highlight outside the lesion is gone
    assert np.array_equal(out[mask != 0], img[mask != 0])


# ---------------------------------------------------------------------------------------------- errors


def test_bad_inputs_are_explained():
    p = get("saturation")
    with pytest.raises(ValueError, match="3 channels"):
        p.apply_batch(torch.rand(2, 1, 8, 8))
    with pytest.raises(ValueError, match=r"shape \(B,C,H,W\)"):
        p.apply_batch(torch.rand(8, 8, 3))
    with pytest.raises(ValueError, match="3 channels"):
        p.apply_batch(torch.rand(2, 8, 8, 3))  # channels-last
    with pytest.raises(ValueError, match=r"\[0,1\]"):
        p.apply_batch(torch.rand(2, 3, 8, 8) * 255)
    with pytest.raises(TypeError, match="float tensor"):
        p.apply_batch(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="empty batch"):
        p.apply_batch(torch.rand(0, 3, 8, 8))
    with pytest.raises(ValueError, match="RGB HWC image with 3 channels"):
        p.apply_numpy(np.zeros((8, 8), np.uint8))
    with pytest.raises(ValueError, match="channels-first"):
        p.apply_numpy(np.zeros((3, 16, 16), np.uint8))
    with pytest.raises(ValueError, match=r"float32 images must lie in \[0,1\]"):
        p.apply_numpy(np.full((8, 8, 3), 200, np.float32))
    with pytest.raises(TypeError, match="uint8 or float32"):
        p.apply_numpy(np.zeros((8, 8, 3), np.int32))
    with pytest.raises(ValueError, match="masks must have shape"):
        get("specularity").apply_batch(torch.rand(2, 3, 16, 16), torch.zeros(2, 8, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="leading dim B=2"):
        p.apply_batch(torch.rand(2, 3, 8, 8), params={"factor": torch.ones(3), "brightness": torch.ones(3)})
    # grey images are fine where colour is not needed
    out, _ = get("blur").apply_numpy(np.zeros((16, 16), np.uint8), rng=np.random.default_rng(0))
    assert out.shape == (16, 16)


@pytest.mark.parametrize("size", [40, 48])
def test_text_fits_small_images_on_both_paths(size):
    # Regression: on small frames the corner block used to start at a negative origin.
    from robusttrain.perturbations.base import index_params

    p = P.get("text", severity=1)  # one short block: a corner stays free of the central lesion
    img = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, size, size, dtype=torch.long)
    mask[:, size // 2 - 3 : size // 2 + 3, size // 2 - 3 : size // 2 + 3] = 1
    out, params = p.apply_batch(img, mask, generator=torch.Generator().manual_seed(0))
    assert (out != img).any()
    assert torch.equal(out[mask[:, None].expand_as(out) == 1], img[mask[:, None].expand_as(img) == 1])
    u8 = (img[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    o_np, _ = p.apply_numpy(u8, mask[0].numpy(), params=index_params(params, 0))
    ref = out[0].permute(1, 2, 0).numpy() * 255
    assert np.abs(o_np.astype(np.float64) - ref).max() <= 2.0


@pytest.mark.parametrize("name", ["blur", "motion_blur"])
def test_large_kernels_on_tiny_images_match_opencv(name):
    # Regression: torch's reflect padding refuses pads >= the image side; OpenCV reflects on.
    from robusttrain.perturbations.base import index_params

    p = P.get(name, severity=5)
    img = torch.rand(2, 3, 24, 24, generator=torch.Generator().manual_seed(3))
    out, params = p.apply_batch(img, generator=torch.Generator().manual_seed(0))
    assert out.shape == img.shape and torch.isfinite(out).all()
    u8 = (img[1].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    o_np, _ = p.apply_numpy(u8, params=index_params(params, 1))
    ref = out[1].permute(1, 2, 0).numpy() * 255
    assert np.abs(o_np.astype(np.float64) - ref).max() <= 2.0


def test_contrast_runs_on_grey_images_on_both_paths():
    # MRI / X-ray recipes are 1-channel: under-exposure must apply there too (without saturation).
    from robusttrain.perturbations.base import index_params

    p = P.get("contrast", severity=5)
    img = torch.rand(3, 1, 32, 32, generator=torch.Generator().manual_seed(2))
    out, params = p.apply_batch(img, generator=torch.Generator().manual_seed(0))
    assert out.shape == img.shape
    assert (out.std(dim=(1, 2, 3)) < 0.6 * img.std(dim=(1, 2, 3))).all()  # contrast lowered
    for i in range(3):
        u8 = (img[i].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        o_hwc, _ = p.apply_numpy(u8, params=index_params(params, i))
        o_hw, _ = p.apply_numpy(u8[:, :, 0], params=index_params(params, i))
        assert o_hwc.shape == (32, 32, 1) and o_hw.shape == (32, 32)
        ref = out[i].permute(1, 2, 0).numpy() * 255
        assert np.abs(o_hwc.astype(np.float64) - ref).max() <= 2.0
    with pytest.raises(ValueError, match="saturation"):
        P.get("saturation").apply_batch(img)


@pytest.mark.parametrize("size", [9, 64])
def test_cpu_opencv_filters_match_torch_kernels(size):
    # On CPU float32 the torch path filters with OpenCV per plane; it must equal the generic
    # torch kernels (grouped conv / FFT, reached here through float64) incl. huge-kernel borders.
    from robusttrain.perturbations import blur as BL

    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 3, size, size, generator=g)
    sigma = torch.tensor([0.7, 5.0, 15.0])
    ksize = 2 * torch.ceil(3 * sigma).long() + 1
    k1 = BL.gaussian_kernel_1d(sigma, ksize, 91)
    assert BL._cpu_planes(x) and not BL._cpu_planes(x.double())
    ref = BL.fft_filter(x.double(), (k1[:, :, None] * k1[:, None, :]).double()).float()
    assert torch.allclose(BL.separable_filter(x, k1), ref, atol=1e-5)
    km = BL.motion_kernel(torch.tensor([3.5, 12.0, 30.0]), torch.tensor([0.0, 0.8, 2.0]), 33)
    ref = BL.fft_filter(x.double(), km.double()).float()
    assert torch.allclose(BL.filter2d_cpu(x, km), ref, atol=1e-5)


def test_cpu_noise_tiles_match_gather():
    from robusttrain.perturbations import blur as BL

    g = torch.Generator().manual_seed(1)
    x = torch.rand(4, 3, 40, 300, generator=g)
    level, off = torch.tensor([0, 1, 3, 5]), torch.tensor([[0, 0], [255, 17], [300, 5], [-3, 999]])
    fast = BL.add_noise_torch(x.clone(), level, off)
    slow = BL.add_noise_torch(x.double(), level, off).float()  # the generic gather path
    assert torch.allclose(fast, slow, atol=1e-6)


def test_placement_maps_memo_never_returns_stale_maps():
    from robusttrain.perturbations.placement import _maps_torch, maps_torch

    img = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    first = maps_torch(img, None)
    assert maps_torch(img, None) is first  # same image: computed once
    img[:, :, :32] = 0.0  # in-place change bumps the version
    fresh = maps_torch(img, None)
    assert fresh is not first
    for a, b in zip(fresh[:2], _maps_torch(img, None)[:2]):
        assert torch.equal(a, b)
    mask = torch.zeros(2, 64, 64, dtype=torch.long)
    mask[:, 40:50, 40:50] = 1
    with_mask = maps_torch(img, mask)  # a different mask is a different key
    assert not torch.equal(with_mask[1], fresh[1])
    # per-image views of one batch, visited test after test (the suite's order), are all memoised
    views = [maps_torch(img[i : i + 1].detach(), None) for i in range(2)]
    assert all(maps_torch(img[i : i + 1].detach(), None) is views[i] for i in range(2))


def test_field_of_view_stops_at_its_fixed_point_with_the_full_result():
    """The loop stops early (on an accelerator the grid goes to the host for it): the border it finds must
    equal all hc + wc dilations', also for a winding dark corridor that needs many steps to follow."""
    from robusttrain.perturbations.border import cell_means, fov_from_cells

    frames = torch.from_numpy(np.stack(_frames(b=3)[0])).permute(0, 3, 1, 2).float() / 255
    low = cell_means(frames)
    winding = torch.full((1, 3, 32, 32), 0.6)
    winding[..., 2, 0:30] = 0.0  # a dark corridor from the left edge, right, down, and back left:
    winding[..., 2:7, 29] = 0.0  # ~60 cells, so it takes ~60 dilations to follow (fewer than hc + wc)
    winding[..., 6, 3:30] = 0.0
    winding[..., 16:22, 12:20] = 0.0  # a dark lumen not connected to the edge: scene, not border
    for cells in (low, winding):
        got = fov_from_cells(cells)
        assert torch.equal(got, fov_from_cells(cells, stop_at_fixed_point=False))
    assert not bool(got[0, 0, 6, 3]) and not bool(got[0, 0, 4, 29])  # the corridor's far end is border
    assert bool(got[0, 0, 18, 16]) and bool(got[0, 0, 12, 10])  # the lumen and the scene are not


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_field_of_view_on_cuda_equals_the_cpu_one_and_stays_on_the_device():
    from robusttrain.perturbations.border import cell_means, fov_from_cells

    low = cell_means(torch.from_numpy(np.stack(_frames(b=3)[0])).permute(0, 3, 1, 2).float() / 255)
    got = fov_from_cells(low.cuda())
    assert got.is_cuda and torch.equal(got.cpu(), fov_from_cells(low))
