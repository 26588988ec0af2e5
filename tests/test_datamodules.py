"""Synthetic generators and the datamodules' split/loader contract (no shared data needed)."""

import numpy as np
import pytest
import torch

from robusttrain.datamodules import ACDCDataModule, CXRDataModule, PolypDataModule, split_by_case
from robusttrain.datamodules.synthetic_acdc import SyntheticACDCSource
from robusttrain.datamodules.synthetic_cxr import SyntheticCXRSource
from robusttrain.datamodules.synthetic_polyp import SyntheticPolypSource
from robusttrain.datamodules.transforms import build_pipeline

SOURCES = [
    lambda seed: SyntheticPolypSource(12, seed=seed, image_size=64),
    lambda seed: SyntheticACDCSource(2, seed=seed, image_size=64),
    lambda seed: SyntheticCXRSource(6, seed=seed, image_size=64),
]


@pytest.mark.parametrize("make", SOURCES, ids=["polyp", "acdc", "cxr"])
def test_synthetic_deterministic_and_seed_dependent(make):
    a, b, c = make(0), make(0), make(1)
    for i in (0, len(a) - 1):
        (ia, ma), (ib, mb) = a.load(i), b.load(i)
        assert np.array_equal(ia, ib) and np.array_equal(ma, mb)
    assert not np.array_equal(a.load(0)[0], c.load(0)[0])
    # index-addressable: sample i alone equals sample i after generating the others
    fresh = make(0)
    assert np.array_equal(fresh.load(len(a) - 1)[0], a.load(len(a) - 1)[0])
    img, mask = a.load(0)
    assert img.shape[:2] == mask.shape == (64, 64) and mask.dtype == np.uint8


def test_synthetic_polyp_contents():
    src = SyntheticPolypSource(30, seed=3, image_size=96, hard_fraction=0.1)
    assert len(src.hard_cases) == 3 and all(c.startswith("synpolyp_") for c in src.hard_cases)
    fg = [src.load(i)[1].mean() for i in range(10)]
    assert all(0.0 < f < 0.5 for f in fg)  # every frame has a polyp, never the whole frame
    img = src.load(0)[0]
    assert img[..., 0].mean() > img[..., 2].mean()  # reddish mucosa
    corners = [src.load(i)[0][0, 0].max() for i in range(10)]
    assert sum(c < 10 for c in corners) >= 5  # most frames have the scope's black border


def test_synthetic_acdc_contents():
    src = SyntheticACDCSource(10, seed=0, image_size=96, hard_fraction=0.1)
    assert len(src.hard_cases) == 2
    cases = {src.case_id(i) for i in range(len(src))}
    assert {"synpat000_ED", "synpat000_ES"} <= cases
    labels = set()
    for i in range(0, len(src), 3):
        labels |= set(np.unique(src.load(i)[1]).tolist())
    assert labels == {0, 1, 2, 3}
    # planted papillary muscles: LV-labelled pixels with myocardium-like intensity
    hard = next(iter(src.hard_cases))
    idx = [i for i in range(len(src)) if src.case_id(i) == hard]
    img, lab = src.load(idx[len(idx) // 2])
    lv = img[lab == 3]
    assert (lv < img[lab == 2].mean() + 0.1).mean() > 0.1


def test_smoke_configuration_batches():
    dm = PolypDataModule(image_size=64, batch_size=8, n_train=24, n_val=8, seed=0)
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (24, 8)
    b = next(iter(dm.train_dataloader()))
    assert b["image"].dtype == torch.float32 and b["image"].shape == (8, 3, 64, 64)
    assert b["image"].min() >= 0 and b["image"].max() <= 1
    assert b["mask"].dtype == torch.int64 and b["mask"].shape == (8, 64, 64)
    assert isinstance(b["case_id"][0], str) and b["slice_index"].dtype == torch.int64
    assert dm.class_names == ["polyp"] and dm.num_classes == 2 and dm.in_channels == 3
    assert dm.planted_hard_cases and set(dm.planted_hard_cases) <= set(
        dm.train_dataset.case_ids() + dm.val_dataset.case_ids()
    )
    assert dm.extra_val_dataloaders() == {}
    v1 = [c for b in dm.val_dataloader() for c in b["case_id"]]
    v2 = [c for b in dm.val_dataloader() for c in b["case_id"]]
    assert v1 == v2 == sorted(v1)  # deterministic order
    assert len(dm.test_dataloader().dataset) == len(dm.predict_dataloader().dataset) == 8


def test_acdc_and_cxr_synthetic_modules():
    dm = ACDCDataModule(image_size=64, n_train=3, n_val=2, batch_size=4)
    dm.setup("fit")
    b = next(iter(dm.train_dataloader()))
    assert b["image"].shape == (4, 1, 64, 64) and dm.num_classes == 4
    assert dm.class_names == ["rv", "myo", "lv"] and int(b["mask"].max()) <= 3
    assert set(dm.val_dataset.case_ids()) == {"synpat003_ED", "synpat003_ES", "synpat004_ED", "synpat004_ES"}
    assert all(c.startswith("synpat") for c in dm.planted_hard_cases)
    cx = CXRDataModule(image_size=64, n_train=4, n_val=2, batch_size=2)
    cx.setup("fit")
    assert next(iter(cx.val_dataloader()))["image"].shape == (2, 1, 64, 64) and cx.class_names == ["lung"]


def test_split_by_case_keeps_cases_together_and_is_seeded():
    ids = [f"p{i // 3}" for i in range(30)]  # 10 cases × 3 slices
    tr, va = split_by_case(ids, 0.2, seed=0)
    assert len(va) == 6 and not {ids[i] for i in tr} & {ids[i] for i in va}
    assert split_by_case(ids, 0.2, seed=0) == (tr, va)
    assert split_by_case(ids, 0.2, seed=1) != (tr, va)


def test_transform_config_formats():
    import albumentations as A
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        [
            {"_target_": "albumentations.HorizontalFlip", "p": 1.0},
            {"_target_": "OneOf", "transforms": [{"_target_": "VerticalFlip", "p": 1.0}], "p": 1.0},
        ]
    )
    pipe = build_pipeline(cfg, image_size=8)
    assert len(build_pipeline([A.NoOp(), {"_target_": "NoOp"}], image_size=None).transforms) == 2
    img = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    out = pipe(image=img, mask=np.zeros((16, 16), np.uint8))
    assert out["image"].shape == (8, 8, 3)
    dm = PolypDataModule(
        image_size=32,
        n_train=4,
        n_val=2,
        batch_size=2,
        train_transforms=[{"_target_": "albumentations.RandomCrop", "height": 16, "width": 16}],
    )
    dm.setup("fit")
    assert dm.train_dataset[0]["image"].shape == (3, 32, 32)  # size fixed up after a crop
