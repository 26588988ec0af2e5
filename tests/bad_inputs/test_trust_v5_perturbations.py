"""Issue 46 ("Trust v5"), the perturbation findings: 8, ``jpeg`` on thin images allocated a grid
``round(512 / shorter side)`` times finer than the image (1.6 GB for a 4 x 1024 strip, a 1 x 2000 one was
killed for memory); 9, ``randconv`` on a 1-pixel-high image ended in torch's padding error; 12, the
Albumentations adapters raised NotImplementedError for a pipeline carrying bboxes or keypoints.
"""

from __future__ import annotations

import albumentations as A
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from robusttrain.perturbations import get
from robusttrain.perturbations.albu import TRANSFORMS
from robusttrain.perturbations.jpeg import jpeg_codec


class LargestTensor(TorchDispatchMode):
    """Records the bytes of the largest tensor any op creates (what a memory blow-up is made of)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.bytes = max(self.bytes, t.numel() * t.element_size())
        return out


# ------------------------------------------------------------------------------------ 8: jpeg memory
THIN = [(4, 1024), (1, 2000), (8, 512)]


@pytest.mark.parametrize(("h", "w"), THIN, ids=[f"{h}x{w}" for h, w in THIN])
def test_jpeg_memory_stays_proportional_to_a_thin_image(h, w):
    # measured on the meta device (the same ops and shapes, nothing allocated: the old code's 12.6 GB grid
    # for 1 x 2000 is recorded here without being allocated), then run for real
    with LargestTensor() as meta:
        jpeg_codec(torch.rand(1, 3, h, w, device="meta"), torch.full((1,), 20, device="meta"))
    # the promise: no bigger than a 1024 x 1024 RGB frame in float64 (25 MB) with the 16-px padding of a
    # 1-px side (34 MB), where the old grid took 400 MB (8 x 512) to 12.6 GB (1 x 2000)
    assert meta.bytes <= 40e6, f"{meta.bytes / 1e6:.0f} MB for a {h}x{w} image"
    x = torch.rand(1, 3, h, w, generator=torch.Generator().manual_seed(0))
    out, _ = get("jpeg", 5).apply_batch(x)
    assert out.shape == x.shape
    assert bool(torch.isfinite(out).all()) and float(out.min()) >= 0 and float(out.max()) <= 1
    assert float((out - x).abs().mean()) > 1e-3  # still compressed, not skipped


def test_jpeg_keeps_its_grid_for_ordinary_images():
    from robusttrain.perturbations.jpeg import grid_factor

    # every square and every image coded <= 8 times finer keeps round(512 / shorter side)
    for h, w in [(16, 16), (32, 32), (31, 31), (48, 64), (100, 500), (128, 96), (574, 500), (1080, 1920)]:
        assert grid_factor(h, w) == max(1, round(512 / min(h, w))), (h, w)


# ------------------------------------------------------------------------------ 9: randconv, 1 px
@pytest.mark.parametrize("shape", [(2, 3, 1, 50), (2, 3, 50, 1), (1, 3, 1, 1), (2, 1, 1, 7)], ids=str)
def test_randconv_takes_a_one_pixel_side_and_both_paths_agree(shape):
    op = get("randconv", 4)
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(1))
    out, p = op.apply_batch(x)
    assert out.shape == x.shape and bool(torch.isfinite(out).all())
    for i in range(shape[0]):  # the numpy path (reflect-101 repeats a lone pixel) gives the same image
        img = x[i].permute(1, 2, 0).numpy()
        ref, _ = op.apply_numpy(img, params={k: v[i].numpy() for k, v in p.items()})
        assert np.abs(ref - out[i].permute(1, 2, 0).numpy()).max() < 1e-5


# ------------------------------------------------------------------ 12: Albumentations, bboxes, keypoints
@pytest.mark.parametrize("family", ["blur", "instrument", "jpeg", "text"])
def test_every_adapter_passes_bboxes_and_keypoints_through_as_albumentations_pixel_transforms_do(family):
    def pipeline(t):
        return A.Compose(
            [t],
            bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"]),
            keypoint_params=A.KeypointParams(format="xy"),
            seed=0,
        )

    img = np.random.default_rng(0).integers(0, 256, (64, 64, 3)).astype(np.uint8)
    data = dict(
        image=img,
        mask=np.zeros((64, 64), np.uint8),
        masks=[np.ones((64, 64), np.uint8)],
        bboxes=[[1, 2, 10, 12], [30, 30, 60, 50]],
        labels=[1, 2],
        keypoints=[[3, 4], [40, 41]],
    )
    ours = pipeline(TRANSFORMS[family](p=1.0))(**data)
    theirs = pipeline(A.GaussianBlur(p=1.0))(**data)  # Albumentations' own pixel-level transform
    for key in ("bboxes", "keypoints", "labels"):
        assert np.array_equal(np.asarray(ours[key]), np.asarray(theirs[key])), key
    assert np.array_equal(ours["masks"][0], data["masks"][0]) and not np.array_equal(ours["image"], img)
    # ReplayCompose replays the same image with the boxes as given
    rc = A.ReplayCompose(
        [TRANSFORMS[family](p=1.0)], bbox_params=A.BboxParams(format="coco", label_fields=["labels"])
    )
    first = rc(image=img, bboxes=[[1, 2, 10, 12]], labels=[1])
    again = A.ReplayCompose.replay(first["replay"], image=img, bboxes=[[1, 2, 10, 12]], labels=[1])
    assert np.array_equal(first["image"], again["image"]) and np.allclose(again["bboxes"], [[1, 2, 10, 12]])
