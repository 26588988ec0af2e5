"""The distribution-shift and camera / codec families (issue 30) and the family traits read from the registry
(issue 33). Parity, replay, masks, devices and the Albumentations round trip: test_conformance.py."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import robusttrain.perturbations as P
from robusttrain.perturbations import get, registry
from robusttrain.perturbations.jpeg import jpeg_codec, quant_tables
from robusttrain.perturbations.optics import disk_kernel
from robusttrain.perturbations.shift import band_amplitude
from robusttrain.perturbations.suites import SUITES, resolve

PKG = Path(P.__file__).parent


def _frame(shared_data: Path | None, size: int = 512) -> np.ndarray:
    """A real Kvasir-SEG frame when the shared data is there, else a textured synthetic one."""
    files = sorted((shared_data / "kvasir_seg" / "images").glob("*.jpg")) if shared_data else []
    if files:
        img = cv2.imread(str(files[0]))[:, :, ::-1]
        return np.ascontiguousarray(cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA))
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[:size, :size].astype(np.float32)
    base = np.stack(
        [170 + 50 * np.sin(xx / 23), 90 + 40 * np.cos(yy / 17), 70 + 30 * np.sin((xx + yy) / 31)], -1
    )
    # sensor-like noise: spatially correlated, a few grey levels (independent noise of sigma 8 at every pixel
    # is no camera's; on it libjpeg's and our colour codec end 1.2 grey levels apart at quality 90)
    noise = cv2.GaussianBlur(rng.normal(0, 8, base.shape).astype(np.float32), (0, 0), 1.0)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def frame() -> np.ndarray:
    # the shared_data fixture's folder, but without it the tests run on a synthetic frame instead of skipping
    env = os.environ.get("ROBUSTTRAIN_SHARED_DATA")
    root = Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"
    return _frame(root if root.is_dir() else None)


# ------------------------------------------------------------------------------------------------ jpeg
def test_quant_tables_are_libjpegs():
    t = quant_tables(torch.tensor([50, 75, 10, 100]))
    assert t[0, 0, 0, 0] == 16 and t[0, 1, 7, 7] == 99  # quality 50: Annex K tables as printed
    assert t[1, 0, 0, 0] == 8 and t[1, 0, 7, 7] == 50  # 75: scale 50 % ((16*50+50)//100, (99*50+50)//100)
    assert t[2, 0, 0, 0] == 80 and t[2, 0, 7, 7] == 255  # 10: scale 500 %, clamped to baseline's 255
    assert bool((t[3] == 1).all())
    assert np.array_equal(quant_tables(np.array([75]), xp=np), t[1:2].numpy())


@pytest.mark.parametrize("quality", [10, 30, 60, 90])
def test_jpeg_matches_opencv_imencode(frame, quality):
    ok, enc = cv2.imencode(
        ".jpg", np.ascontiguousarray(frame[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    assert ok
    ref = cv2.imdecode(enc, cv2.IMREAD_COLOR)[:, :, ::-1].astype(np.float64)
    x = torch.from_numpy(frame).permute(2, 0, 1)[None].float() / 255
    # a decoder hands back 8-bit pixels: compare ours at the same precision (float vs integer alone is ~0.25)
    ours = np.round(jpeg_codec(x, torch.tensor([quality]))[0].permute(1, 2, 0).double().numpy() * 255)
    codec_err = np.abs(ref - frame).mean()
    assert np.abs(ours - ref).mean() < min(1.0, 0.6 * codec_err), (np.abs(ours - ref).mean(), codec_err)
    assert abs(np.abs(ours - frame).mean() - codec_err) < 0.1 * codec_err  # the same amount of damage
    grey = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY)
    ok, enc = cv2.imencode(".jpg", grey, [cv2.IMWRITE_JPEG_QUALITY, quality])
    gref = cv2.imdecode(enc, cv2.IMREAD_GRAYSCALE).astype(np.float64)
    g = (
        jpeg_codec(torch.from_numpy(grey)[None, None].float() / 255, torch.tensor([quality]))[0, 0].double()
        * 255
    ).round()
    assert np.abs(g.numpy() - gref).mean() < min(1.0, 0.6 * np.abs(gref - grey).mean())


def test_jpeg_shows_8px_blocks_at_512_and_the_downsized_damage_at_128(frame):
    p = get("jpeg", severity=5)
    params = {"quality": np.array(10)}
    big, _ = p.apply_numpy(frame, params=params)
    # blocking: the image jumps across block edges more than inside blocks
    d = np.abs(np.diff(big.astype(np.float32).mean(2), axis=1))
    assert d[:, 7::8].mean() > 1.3 * np.delete(d, np.s_[7::8], axis=1).mean()
    # A quantiser's error pattern cannot commute with downsizing pixel by pixel, but its amount must: at
    # 128 px the damage is that of the 512-px result downsized, where coding the 128-px grid itself (what
    # cv2.imencode would do) is twice too strong.
    small = cv2.resize(frame, (128, 128), interpolation=cv2.INTER_AREA)
    out, _ = p.apply_numpy(small, params=params)
    ref = np.abs(cv2.resize(big, (128, 128), interpolation=cv2.INTER_AREA).astype(np.float32) - small).mean()
    ok, enc = cv2.imencode(".jpg", np.ascontiguousarray(small[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 10])
    native = np.abs(cv2.imdecode(enc, cv2.IMREAD_COLOR)[:, :, ::-1].astype(np.float32) - small).mean()
    ours = np.abs(out.astype(np.float32) - small).mean()
    assert 0.7 * ref < ours < 1.3 * ref and native > 1.5 * ref, (ours, ref, native)
    same, _ = p.apply_numpy(small, params={"quality": np.array(100)})  # (nearly) lossless: the image back
    assert np.abs(same.astype(np.float32) - small).mean() < 0.6


# ------------------------------------------------------------------------------------------------ fourier_mix
def test_fourier_mix_takes_the_partners_low_frequency_amplitude_and_replays_on_its_own():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 3, 48, 64, generator=g) * 0.3 + torch.tensor([0.6, 0.3, 0.1])[None, :, None, None]
    x[2:] = x[2:].flip(1)  # two colour styles in one batch
    p = get("fourier_mix", severity=5)
    out, params = p.apply_batch(x, generator=torch.Generator().manual_seed(1))
    partner = params["partner"]
    assert bool((partner != torch.arange(4)).all()) and bool(((partner >= 0) & (partner < 4)).all())
    band = p.BAND[5]
    assert torch.allclose(params["amp"], band_amplitude(x[partner], band))
    # with ratio 1 (FDA) the output's band amplitude is the partner's, its phase the image's own
    full = dict(params, ratio=torch.ones(4))
    o1, _ = p.apply_batch(x, params=full)
    assert torch.allclose(
        band_amplitude(o1, band)[:, :, band - 2 : band + 3, :3],
        params["amp"][:, :, band - 2 : band + 3, :3],
        atol=2e-3,
    )
    assert torch.allclose(o1.mean((2, 3)), x[partner].mean((2, 3)), atol=2e-3)  # DC: the partner's colour
    # a sample replays alone (params hold the partner's amplitude, not just its position)
    for i in range(4):
        one, _ = p.apply_batch(x[i : i + 1], params={k: v[i : i + 1] for k, v in params.items()})
        assert torch.allclose(one[0], out[i], atol=1e-6)


def test_fourier_mix_alone_uses_the_documented_stand_in():
    yy, xx = torch.meshgrid(torch.linspace(0, 1, 48), torch.linspace(0, 1, 64), indexing="ij")
    u, v = yy - 0.3 + xx - 0.35, yy - 0.3 - xx + 0.35  # a diagonal streak of light: not separable, so its
    shade = 0.25 + 0.5 * torch.exp(-(u**2) / 0.02 - v**2 / 0.5)  # mirror image has another amplitude
    x = (shade[None] * torch.tensor([0.9, 0.5, 0.3])[:, None, None])[None]
    p = get("fourier_mix", severity=5)
    out, params = p.apply_batch(x, generator=torch.Generator().manual_seed(0))
    assert int(params["partner"][0]) == 0
    assert torch.allclose(params["amp"], band_amplitude(x.flip(-1), p.BAND[5]))
    assert torch.allclose(out.mean((2, 3)), x.mean((2, 3)), atol=2e-3)  # no colour invented
    assert float((out - x).abs().mean()) > 0.01  # but the shading changed
    img = (x[0].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    o, pn = p.apply_numpy(img, rng=np.random.default_rng(0))
    assert int(pn["partner"]) == 0 and np.abs(o.astype(int) - img).mean() > 2
    with pytest.raises(ValueError, match=r"params\['amp'\] must have shape \(B, C=1"):
        p.apply_batch(x[:, :1], params=params)


# ------------------------------------------------------------------------------------------------ randconv
def test_randconv_mix_zero_is_identity_and_one_keeps_mean_and_std():
    x = torch.rand(3, 3, 40, 40, generator=torch.Generator().manual_seed(0))
    p = get("randconv", severity=5)
    _, params = p.apply_batch(x, generator=torch.Generator().manual_seed(2))
    same, _ = p.apply_batch(x, params=dict(params, mix=torch.zeros(3)))
    assert torch.allclose(same, x, atol=1e-6)
    full, _ = p.apply_batch(x * 0.5 + 0.25, params=dict(params, mix=torch.ones(3)))
    xs = x * 0.5 + 0.25
    assert torch.allclose(full.mean((1, 2, 3)), xs.mean((1, 2, 3)), atol=0.02)
    assert not torch.allclose(full[0], full[1], atol=0.05)  # each sample its own network
    assert params["weights"].shape == (3, 275) and not torch.equal(params["weights"][0], params["weights"][1])


# ------------------------------------------------------------------------------------------------ camera / optics
def test_sensor_noise_grows_with_the_signal_and_luma_mode_is_grey():
    img = np.tile(np.linspace(0, 255, 512).astype(np.uint8)[None, :, None], (512, 1, 3))
    out, _ = get("sensor_noise", severity=5).apply_numpy(img, rng=np.random.default_rng(0))
    d = out.astype(np.float32) - img
    assert d[:, 380:480].std() > 1.5 * d[:, 30:60].std() > 0  # shot noise: variance a x + b^2
    assert 8 < d[:, 240:270].std() < 18  # ~0.055 at mid-grey = 14 grey levels (severity 5, 512 px)
    luma, p = get("sensor_noise", severity=5, chroma=False).apply_numpy(img, rng=np.random.default_rng(0))
    dl = luma.astype(np.int16) - img
    assert int(p["chroma"]) == 0 and np.array_equal(dl[200:300, 200:300, 0], dl[200:300, 200:300, 2])
    assert not np.array_equal(d[200:300, 200:300, 0], d[200:300, 200:300, 2])


def test_vignetting_darkens_towards_the_edge_around_its_centre():
    img = np.full((96, 128, 3), 200, np.uint8)
    params = {"center_rel": np.float32([0.5, 0.5]), "strength": np.float32(0.6), "power": np.float32(2.0)}
    out, _ = get("vignetting").apply_numpy(img, params=params)
    row = out[48, 64:, 0].astype(int)
    assert row[0] == 200 - 0 or row[0] >= 199
    assert np.all(np.diff(row) <= 0) and row[-1] < 170
    # linear light: at the corner rho = 1, so the displayed value is 200 * (1 - 0.6) ** (1 / 2.2)
    assert abs(int(out[0, 0, 0]) - 200 * 0.4 ** (1 / 2.2)) <= 2


def test_defocus_is_a_flat_disk_not_a_gaussian():
    k = disk_kernel(torch.tensor([8.0]), 21)[0]
    assert abs(float(k.sum()) - 1) < 1e-5
    assert float(k[10, 10]) == pytest.approx(float(k[10, 14]), rel=0.05)  # flat inside the disk
    assert float(k[10, 19]) < 0.05 * float(k[10, 10])  # and nothing beyond its edge
    tiny = disk_kernel(torch.tensor([1e-4]), 5)[0]
    assert float(tiny[2, 2]) > 0.999  # the identity as the radius -> 0
    np.testing.assert_allclose(
        disk_kernel(np.float32([3.3]), 11, xp=np)[0],
        disk_kernel(torch.tensor([3.3]), 11)[0].numpy(),
        atol=1e-6,
    )


@pytest.mark.parametrize("name", ["gamma", "exposure", "motion_blur"])
def test_heldout_families_run_on_rgb_with_one_curve_per_channel(name):
    img = np.stack([np.tile(np.arange(0, 256, 4, dtype=np.uint8), (16, 1))] * 3, -1)
    p = get(name, severity=4)
    out, params = p.apply_numpy(img, rng=np.random.default_rng(0))
    grey, _ = p.apply_numpy(img[:, :, 0], params=params)
    assert (
        out.shape == img.shape and np.array_equal(out[:, :, 0], grey) and np.array_equal(out[:, :, 2], grey)
    )
    assert name in P.available(channels=3)


# ------------------------------------------------------------------------------------------------ traits, registry, suites
def test_traits_are_read_from_the_classes():
    assert registry.occluding() == ["instrument", "feces", "blood", "text", "xray_markers", "collimation"]
    assert set(P.available()) - set(registry.trainable()) == {"adversarial", "melt"}
    assert "gamma" in registry.trainable(channels=3) and "bias_field" not in registry.trainable(channels=3)
    from robusttrain.training.worst_of_k import OCCLUDERS

    assert frozenset(registry.occluding()) == OCCLUDERS
    with pytest.raises(ValueError, match="trainable: channels must be 1 or 3"):
        registry.trainable(channels=4)


def test_adding_a_family_is_one_class_and_one_registry_line(monkeypatch):
    class Curtain(P.Perturbation):
        name, rgb, occludes = "curtain", False, True

        def _apply_torch(self, images, masks, params):
            return images * 0

    monkeypatch.setitem(registry._REGISTRY, "curtain", Curtain)
    assert "curtain" in P.available(channels=1) and "curtain" in P.occluding() and "curtain" in P.trainable()
    assert resolve(["curtain"]) == ["curtain"] and get("curtain", severity=2).severity == 2


def test_suites_shift_and_endoscopy_heldout():
    assert SUITES["shift"] == ("randconv", "fourier_mix")
    assert resolve("endoscopy_heldout") == [
        "motion_blur",
        "gamma",
        "exposure",
        "sensor_noise",
        "jpeg",
        "defocus",
        "vignetting",
    ]
    assert len(SUITES["endoscopy"]) == 9 and not set(SUITES["endoscopy"]) & set(SUITES["endoscopy_heldout"])
    assert set(resolve(["shift", "endoscopy_heldout"])) <= set(P.available(channels=3))
    assert set(resolve("endoscopy_heldout")) <= set(P.trainable(channels=3))


def _intra_package_imports(path: Path) -> set[str]:
    """Modules of the perturbations package that ``path`` imports (at the top or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
    return out


def test_no_import_circle_in_the_package():
    mods = {f.stem: _intra_package_imports(f) for f in PKG.glob("*.py") if f.stem != "__init__"}
    # imports of the package itself ("from . import x") go through __init__, which imports everything
    assert not any("__init__" in deps for deps in mods.values())

    def reach(start: str, seen: set[str]) -> set[str]:
        for d in mods.get(start, ()):
            if d in mods and d not in seen:
                seen.add(d)
                reach(d, seen)
        return seen

    circles = sorted(m for m in mods if m in reach(m, set()))
    assert not circles, f"modules on an import circle: {circles}"
