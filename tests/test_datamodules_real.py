"""Each reader on the real samples in ../shared/data (skipped when the folder is absent)."""

import torch

from robusttrain.datamodules import ACDCDataModule, CXRDataModule, PolypDataModule
from robusttrain.datamodules.readers import FolderSource


def _check_batch(b, channels, size):
    assert b["image"].shape[1:] == (channels, size, size) and b["image"].dtype == torch.float32
    assert float(b["image"].min()) >= 0 and float(b["image"].max()) <= 1
    assert b["mask"].dtype == torch.int64 and b["mask"].shape[1:] == (size, size)


def test_kvasir_with_etis_and_polypgen_extra_val(shared_data):
    dm = PolypDataModule(
        root=str(shared_data / "kvasir_seg"),
        image_size=64,
        batch_size=16,
        seed=0,
        extra_val={"etis": str(shared_data / "etis_larib"), "polypgen": str(shared_data / "polypgen")},
    )
    dm.setup("fit")
    assert len(dm.train_dataset) + len(dm.val_dataset) == 100 and len(dm.val_dataset) == 20
    assert not set(dm.train_dataset.case_ids()) & set(dm.val_dataset.case_ids())
    assert dm.planted_hard_cases == []
    b = next(iter(dm.val_dataloader()))
    _check_batch(b, 3, 64)
    assert set(b["mask"].unique().tolist()) <= {0, 1} and b["mask"].sum() > 0
    extra = dm.extra_val_dataloaders()
    assert len(extra["etis"].dataset) == 4 and len(extra["polypgen"].dataset) == 26
    # PolypGen masks are named <stem>_mask.jpg; case id is the image stem
    assert "EndoCV2021_001035" in extra["polypgen"].dataset.case_ids()
    eb = next(iter(extra["etis"]))
    _check_batch(eb, 3, 64)


def test_cvc_clinicdb_png(shared_data):
    src = FolderSource(shared_data / "cvc_clinicdb")
    assert len(src) == 6
    img, mask = src.load(0)
    assert img.shape == (288, 384, 3) and set(mask.ravel().tolist()) == {0, 1}
    assert src.load(0)[0] is img  # cached after the first read


def test_polypgen_rgb_masks_thresholded(shared_data):
    src = FolderSource(shared_data / "polypgen")
    assert len(src) == 26
    i = next(k for k in range(len(src)) if src.case_id(k) == "EndoCV2021_001035")
    assert src.load(i)[1].sum() == 0  # a true-negative frame: empty mask


def test_acdc_hdf5(shared_data):
    dm = ACDCDataModule(root=str(shared_data / "acdc"), image_size=96, batch_size=8, val_fraction=0.2, seed=0)
    dm.setup("fit")
    cases = dm.train_dataset.case_ids() + dm.val_dataset.case_ids()
    assert len(cases) == 20 and "patient011_ED" in cases and "patient011_ES" in cases
    pats = lambda ds: {c.split("_")[0] for c in ds.case_ids()}
    assert not pats(dm.train_dataset) & pats(dm.val_dataset)  # both phases of a patient together
    assert len(pats(dm.val_dataset)) == 2
    b = next(iter(dm.val_dataloader()))
    _check_batch(b, 1, 96)
    assert b["slice_index"].tolist()[:3] == [0, 1, 2]
    assert set(b["mask"].unique().tolist()) <= {0, 1, 2, 3}


def test_shenzhen_cxr(shared_data):
    dm = CXRDataModule(root=str(shared_data / "shenzhen_cxr"), image_size=64, batch_size=8)
    dm.setup("fit")
    assert len(dm.train_dataset) + len(dm.val_dataset) == 40
    b = next(iter(dm.val_dataloader()))
    _check_batch(b, 1, 64)
    frac = b["mask"].float().mean().item()
    assert 0.1 < frac < 0.5  # lungs are 13–42 % of the frame
