"""The contract every registered perturbation family follows, checked for each family on every channel
count it supports and on every device (``device`` fixture: CPU always, CUDA when present, marked ``cuda``).

A new family is covered by registering it: the parametrization is ``available()`` itself. The contract
(see :mod:`robusttrain.perturbations.base`): both paths accept what they claim and return the input's
shape and dtype in [0,1]; the numpy path agrees with the torch path within 2/255 for the same params;
params replay exactly (also across the numpy and torch schemas); a sample's output depends on its own
params only; masks (and inputs) are never modified; NaN is refused; severities outside 1..5 are refused;
the Albumentations transform survives ``to_dict`` / ``from_dict``. Family-specific behaviour (lesion left
alone, physics, calibration) lives in the per-family test files.
"""

from __future__ import annotations

import json

import albumentations as A
import numpy as np
import pytest
import torch

import robusttrain.perturbations as P
from robusttrain.perturbations import albu, get, index_params
from robusttrain.perturbations.base import TorchRandom
from robusttrain.perturbations.placement import PlacedSampling

TOL = 2 / 255 + 1e-6
H, W = 64, 80  # small and non-square, so swapped axes show
CASES = [(name, c) for name in P.available() for c in (3, 1) if name in P.available(channels=c)]
IDS = [f"{name}-{c}ch" for name, c in CASES]
GREY_ONLY = set(P.available()) - set(P.available(channels=3))


@pytest.fixture(
    params=[
        "cpu",
        "emulated",
        pytest.param(
            "cuda",
            marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
        ),
    ]
)
def device(request):
    """``emulated``: the accelerator code path on the CPU (``robusttrain.testing.emulated_device``): tensors on
    ``meta`` that hold real data, and any op that mixes in a host tensor fails as it does on CUDA."""
    if request.param != "emulated":
        yield torch.device(request.param)
        return
    from robusttrain.testing.emulated_device import EmulatedDevice

    with EmulatedDevice() as dev:
        yield dev.device


def images(channels: int, b: int = 3, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """B uint8 HWC images and int64 lesion masks: endoscopy-like RGB frames (texture, highlights for melt,
    a dark border) or grey phantoms (a bright ellipse with a ring)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:H, :W].astype(np.float32)
    imgs, masks = [], []
    for i in range(b):
        if channels == 3:
            base = np.stack(
                [180 + 40 * np.sin(xx / 9 + i), 90 + 30 * np.cos(yy / 7), 70 + 20 * np.sin((xx + yy) / 11)],
                -1,
            ) + rng.normal(0, 6, (H, W, 3))
            base[rng.integers(8, H - 8, 6), rng.integers(8, W - 8, 6)] = 255
            base[np.abs(yy - H / 2) + np.abs(xx - W / 2) > 0.7 * (H + W) / 2] = 2
        else:
            r = ((yy - H / 2) / (0.38 * H)) ** 2 + ((xx - W / 2 - 2 * i) / (0.4 * W)) ** 2
            base = (30 + 150 * (r < 1) + 50 * ((r > 0.2) & (r < 0.35)) + rng.normal(0, 4, (H, W)))[:, :, None]
        m = np.zeros((H, W), np.int64)
        m[H // 2 - 4 + 2 * i : H // 2 + 8, W // 2 - 8 : W // 2 + 8] = 1
        imgs.append(np.clip(base, 0, 255).astype(np.uint8))
        masks.append(m)
    return imgs, masks


def batch(imgs: list[np.ndarray], device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float().div(255).to(device)


def make(name: str, channels: int, severity: int = 3, device: torch.device | None = None) -> P.Perturbation:
    if name != "adversarial":
        return get(name, severity=severity)
    torch.manual_seed(0)  # the one family that needs a model: a tiny two-class segmenter
    model = torch.nn.Sequential(
        torch.nn.Conv2d(channels, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1)
    )
    return get(name, severity=severity, model=model.to(device or "cpu"))


def torch_paths(p: P.Perturbation, device: torch.device) -> list[bool | None]:
    """The CPU torch path of grey families has two implementations (per-plane OpenCV, torch kernels as on an
    accelerator): check both on CPU."""
    return [True, False] if hasattr(p, "cpu_planes") and device.type == "cpu" else [None]


@pytest.mark.parametrize(("name", "channels"), CASES, ids=IDS)
def test_numpy_and_torch_paths_agree_and_keep_shape_dtype_range(name, channels, device):
    imgs, masks = images(channels)
    x, m = batch(imgs, device), torch.from_numpy(np.stack(masks)).to(device)
    x0, m0 = x.clone(), m.clone()
    for severity in P.base.SEVERITIES:
        p = make(name, channels, severity, device)
        for planes in torch_paths(p, device):
            if planes is not None:
                p.cpu_planes = planes
            out, params = p.apply_batch(x, m, generator=torch.Generator().manual_seed(severity))
            assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
            assert float(out.min()) >= 0 and float(out.max()) <= 1
            assert all(v.shape[0] == len(imgs) and v.device == x.device for v in params.values())
            for i in range(len(imgs)):
                ref = out[i].permute(1, 2, 0).cpu().numpy()
                pi = index_params(params, i)
                u8 = imgs[i][:, :, 0] if channels == 1 else imgs[i]  # grey: (H,W) in -> (H,W) out
                o8, _ = p.apply_numpy(u8, masks[i], params=pi)
                of, _ = p.apply_numpy(imgs[i].astype(np.float32) / 255, masks[i], params=pi)
                assert o8.dtype == np.uint8 and o8.shape == u8.shape
                assert (
                    of.dtype == np.float32 and of.shape == imgs[i].shape and of.min() >= 0 and of.max() <= 1
                )
                assert np.abs(o8.reshape(ref.shape).astype(np.float32) / 255 - ref).max() <= TOL, (
                    severity,
                    i,
                )
                assert np.abs(of - ref).max() <= TOL, (severity, i)
            if device.type != "cpu":  # an accelerator gives what the CPU gives, and samples on itself
                cpu, _ = p.apply_batch(x.cpu(), m.cpu(), params={k: v.cpu() for k, v in params.items()})
                assert float((out.cpu() - cpu).abs().max()) <= 1 / 255
                if device.type != "meta":  # the emulated device has no generator of its own
                    _, on = p.apply_batch(
                        x, m, generator=torch.Generator(device=device).manual_seed(severity)
                    )
                    assert all(v.device == x.device for v in on.values())
        # every severity is visible, except where it cannot be: melt finds nothing to remove on some frames,
        # a severity-1 blur is sub-pixel on a 64-px image (relative units: calibrated at 512 px), as is the
        # 8-px block of a quality 55-70 JPEG on the smooth grey phantoms (64 px: an eighth of the codec's
        # grid; measured 0.8 grey levels at most), and the grey phantoms differ only by a shift, which
        # leaves the amplitude spectrum fourier_mix swaps unchanged
        if (
            name != "melt"
            and not (name in ("blur", "motion_blur") and severity == 1)
            and not (name == "jpeg" and severity == 1 and channels == 1)
            and not (name == "fourier_mix" and channels == 1)
        ):
            change = float((out - x).abs().amax())
            assert change > (4 if name in GREY_ONLY else 1) / 255, f"severity {severity} changed nothing"
    assert torch.equal(x, x0) and torch.equal(m, m0)  # inputs and masks untouched


@pytest.mark.parametrize(("name", "channels"), CASES, ids=IDS)
def test_params_replay_exactly_on_both_paths_and_schemas(name, channels, device):
    imgs, masks = images(channels)
    x, m = batch(imgs, device), torch.from_numpy(np.stack(masks)).to(device)
    p = make(name, channels, 4, device)
    out, params = p.apply_batch(x, m, generator=torch.Generator().manual_seed(7))
    again, _ = p.apply_batch(x, m, params=params)
    assert torch.equal(out, again)
    moved, _ = p.apply_batch(x, m, params={k: v.cpu() for k, v in params.items()})  # params from the host
    assert torch.equal(out, moved)
    a, pa = p.apply_numpy(imgs[0], masks[0], rng=np.random.default_rng(3))
    b, pb = p.apply_numpy(imgs[0], masks[0], rng=np.random.default_rng(3))
    assert np.array_equal(a, b)
    assert pa.keys() == set(params) and all(np.array_equal(pa[k], pb[k]) for k in pa)
    c, _ = p.apply_numpy(imgs[0], masks[0], params=pa)
    assert np.array_equal(a, c)
    # the numpy schema replays on the torch path
    t, _ = p.apply_batch(x[:1], m[:1], params={k: torch.as_tensor(v)[None] for k, v in pa.items()})
    assert np.abs(t[0].permute(1, 2, 0).cpu().numpy() - a.astype(np.float32) / 255).max() <= TOL


@pytest.mark.parametrize(("name", "channels"), CASES, ids=IDS)
def test_each_sample_depends_on_its_own_params_only(name, channels, device):
    imgs, masks = images(channels, seed=2)
    x, m = batch(imgs, device), torch.from_numpy(np.stack(masks)).to(device)
    p = make(name, channels, 3, device)
    for planes in torch_paths(p, device):
        if planes is not None:
            p.cpu_planes = planes
        out, params = p.apply_batch(x, m, generator=torch.Generator().manual_seed(1))
        if name != "adversarial":  # its delta is a gradient, not a draw
            assert any(not torch.equal(v[0], v[j]) for v in params.values() for j in range(1, len(imgs))), (
                "every sample got the same params"
            )
        for i in range(len(imgs)):
            one, _ = p.apply_batch(
                x[i : i + 1], m[i : i + 1], params={k: v[i : i + 1] for k, v in params.items()}
            )
            assert torch.allclose(one[0], out[i], atol=1e-6)


class _MetaRandom(TorchRandom):
    """Draws on the ``meta`` device: any constant a draw mixes in from the CPU shows up without a GPU."""

    def __init__(self) -> None:
        super().__init__(None)
        self.device = torch.device("meta")


@pytest.mark.parametrize("name", sorted(set(P.available()) - {"adversarial"}))  # its delta is a gradient
@pytest.mark.parametrize("severity", [1, 5])
def test_draws_stay_on_the_generators_device(name, severity):
    """A CUDA generator draws on the GPU; every param a family draws must be made there too (text and
    xray_markers mixed CPU constants into CUDA draws and failed on the first GPU run, 2026-11-26)."""
    op = make(name, 3 if name in P.available(channels=3) else 1, severity)
    params = op._draw(_MetaRandom(), 3)
    # the placed families take their params from the placement sampler over the image's cell maps, not from
    # ``_draw`` (an empty dict; their device handling is what the cuda-marked tests above check); any other
    # family whose ``_draw`` stops drawing fails here
    assert params or isinstance(op, PlacedSampling), f"{name}: _draw drew nothing"
    for key, v in params.items():
        assert torch.is_tensor(v) and v.device.type == "meta", (name, key, getattr(v, "device", type(v)))
        assert v.shape[0] == 3, (name, key, tuple(v.shape))


@pytest.mark.parametrize(("name", "channels"), CASES, ids=IDS)
def test_numpy_path_leaves_image_and_mask_untouched(name, channels):
    imgs, masks = images(channels, b=2, seed=3)
    p = make(name, channels, 5)
    for i in range(2):
        img, mask = imgs[i].copy(), masks[i].copy()
        p.apply_numpy(img, mask, rng=np.random.default_rng(i))
        assert np.array_equal(img, imgs[i]) and np.array_equal(mask, masks[i])


@pytest.mark.parametrize(("name", "channels"), CASES, ids=IDS)
def test_nan_is_refused(name, channels, device):
    if device.type != "cpu":
        pytest.skip(
            "by design the value-range check runs on CPU tensors only (no device->host sync per batch)"
        )
    imgs, masks = images(channels, b=2)
    x = batch(imgs, device)
    x[1, 0, 3, 4] = float("nan")
    p = make(name, channels, 3, device)
    with pytest.raises(ValueError, match=r"NaN or inf \(batch index \[1\]\)"):
        p.apply_batch(x)
    f = imgs[0].astype(np.float32) / 255
    f[2, 2, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        p.apply_numpy(f, masks[0], rng=np.random.default_rng(0))


@pytest.mark.parametrize("name", P.available())
@pytest.mark.parametrize("severity", [0, 6, 2.5, "3", True])
def test_severity_outside_1_to_5_is_refused(name, severity):
    with pytest.raises(ValueError, match="severity must be an int in 1..5"):
        make(name, 3, severity)


@pytest.mark.parametrize(
    ("name", "channels"),
    [c for c in CASES if c[0] in albu.TRANSFORMS],
    ids=[i for c, i in zip(CASES, IDS) if c[0] in albu.TRANSFORMS],
)
def test_albumentations_transform_round_trips_and_keeps_the_mask(name, channels):
    imgs, masks = images(channels, b=1)
    img, mask = (imgs[0][:, :, 0] if channels == 1 else imgs[0]), masks[0].astype(np.uint8)
    pipe = A.Compose([albu.TRANSFORMS[name](severity=4, p=1.0)], seed=11)
    back = A.from_dict(json.loads(json.dumps(A.to_dict(pipe))))
    assert type(back.transforms[0]) is albu.TRANSFORMS[name] and back.transforms[0].family_args == {
        **pipe.transforms[0].family_args
    }
    out = pipe(image=img, mask=mask)
    again = A.Compose(back.transforms, seed=11)(image=img, mask=mask)
    assert np.array_equal(out["image"], again["image"]) and np.array_equal(out["mask"], mask)
    assert out["image"].dtype == np.uint8 and out["image"].shape == img.shape
    # the adapter draws from the pipeline's generator: exactly the numpy path on that generator's stream
    ref, _ = get(name, severity=4).apply_numpy(img, mask, rng=np.random.default_rng(11))
    assert np.array_equal(out["image"], ref)


def test_every_registered_family_is_covered():
    assert {n for n, _ in CASES} == set(P.available())
    assert all(name in P.available(channels=c) for name, c in CASES)
