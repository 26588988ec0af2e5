"""Bad data → DataError naming the file or folder."""

import cv2
import h5py
import numpy as np
import pytest

from robusttrain.datamodules import ACDCDataModule, DataError, PolypDataModule
from robusttrain.datamodules.readers import FolderSource


def _pair(root, name, size=(20, 16), mask_size=None, mask_value=255):
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(root / "images" / f"{name}.png"), np.full((*size, 3), 120, np.uint8))
    m = np.zeros(mask_size or size, np.uint8)
    m[2:6, 2:6] = mask_value
    cv2.imwrite(str(root / "masks" / f"{name}.png"), m)


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match="nope"):
        PolypDataModule(root=str(tmp_path / "nope")).setup("fit")


def test_empty_folder(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    with pytest.raises(DataError, match="empty dataset"):
        FolderSource(tmp_path)
    with pytest.raises(DataError, match=str(tmp_path)):
        ACDCDataModule(root=str(tmp_path)).setup("fit")


def test_missing_masks_folder(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match="no masks/"):
        FolderSource(tmp_path)


def test_image_without_mask(tmp_path):
    _pair(tmp_path, "a")
    cv2.imwrite(str(tmp_path / "images" / "lonely.png"), np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(DataError, match="lonely.png"):
        FolderSource(tmp_path)


def test_corrupt_image(tmp_path):
    _pair(tmp_path, "a")
    (tmp_path / "images" / "b.jpg").write_bytes(b"not a jpeg at all")
    cv2.imwrite(str(tmp_path / "masks" / "b.png"), np.zeros((8, 8), np.uint8))
    src = FolderSource(tmp_path)
    with pytest.raises(DataError, match=r"b\.jpg"):
        src.load([src.case_id(i) for i in range(len(src))].index("b"))


def test_size_mismatch(tmp_path):
    _pair(tmp_path, "odd", size=(20, 16), mask_size=(10, 8))
    with pytest.raises(DataError, match=r"odd\.png.*odd\.png"):
        FolderSource(tmp_path).load(0)


def test_mask_value_out_of_range_index_mode(tmp_path):
    _pair(tmp_path, "multi", mask_value=7)
    with pytest.raises(
        DataError, match=r"multi\.png: values 0 \(\d+ px\), 7 \(16 px\) fit neither mask encoding"
    ):
        FolderSource(tmp_path, mask_mode="class_index", num_classes=4).load(0)


def _h5(path, label_max=3, label_shape=None):
    with h5py.File(path, "w") as h:
        h["image"] = np.random.default_rng(0).random((3, 12, 10)).astype(np.float32)
        lab = np.zeros(label_shape or (3, 12, 10), np.uint8)
        lab[:, 3:6, 3:6] = label_max
        h["label"] = lab


def test_acdc_label_out_of_range_and_corrupt(tmp_path):
    _h5(tmp_path / "patient001_frame01.h5")
    _h5(tmp_path / "patient001_frame02.h5", label_max=7)
    dm = ACDCDataModule(root=str(tmp_path), image_size=16, val_fraction=0.0, batch_size=8)
    dm.setup("fit")
    assert dm.train_dataset.case_ids() == ["patient001_ED", "patient001_ES"]
    with pytest.raises(DataError, match=r"patient001_frame02\.h5.*outside the class range"):
        [dm.train_dataset[i] for i in range(len(dm.train_dataset))]
    (tmp_path / "patient002_frame01.h5").write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"patient002_frame01\.h5"):
        ACDCDataModule(root=str(tmp_path)).setup("fit")


def test_acdc_shape_mismatch(tmp_path):
    _h5(tmp_path / "patient003_frame01.h5", label_shape=(3, 12, 9))
    with pytest.raises(DataError, match=r"patient003_frame01\.h5.*shape"):
        ACDCDataModule(root=str(tmp_path)).setup("fit")


def test_acdc_nifti_layout(tmp_path):
    import nibabel as nib  # a declared dependency: a missing one is a broken install, not a skip

    d = tmp_path / "patient005"
    d.mkdir()
    (d / "Info.cfg").write_text("ED: 1\nES: 9\nGroup: NOR\n")
    for f in (1, 9):
        img = np.random.default_rng(f).random((10, 12, 4)).astype(np.float32) * 500  # (X, Y, Z)
        lab = np.zeros((10, 12, 4), np.uint8)
        lab[2:5, 2:5] = 3
        nib.save(nib.Nifti1Image(img, np.eye(4)), str(d / f"patient005_frame{f:02d}.nii.gz"))
        nib.save(nib.Nifti1Image(lab, np.eye(4)), str(d / f"patient005_frame{f:02d}_gt.nii.gz"))
    dm = ACDCDataModule(root=str(tmp_path), image_size=16, val_fraction=0.0, batch_size=4)
    dm.setup("fit")
    assert dm.train_dataset.case_ids() == ["patient005_ED", "patient005_ES"]
    s = dm.train_dataset[0]
    assert s["image"].shape == (1, 16, 16) and float(s["image"].max()) <= 1 and s["mask"].max() == 3
    (d / "patient005_frame09_gt.nii.gz").unlink()
    with pytest.raises(DataError, match=r"patient005_frame09\.nii\.gz"):
        ACDCDataModule(root=str(tmp_path)).setup("fit")


def test_pranet_and_cvc_tif_layouts(tmp_path):
    # PraNet: TrainDataset/image|mask is the training set; TestDataset/<name>/images|masks as extra val
    tr = tmp_path / "pranet" / "TrainDataset"
    for d in ("image", "mask"):
        (tr / d).mkdir(parents=True)
    for k in range(3):
        cv2.imwrite(str(tr / "image" / f"{k}.png"), np.full((16, 16, 3), 90, np.uint8))
        cv2.imwrite(str(tr / "mask" / f"{k}.png"), np.full((16, 16), 255, np.uint8))
    _pair(tmp_path / "pranet" / "TestDataset" / "ETIS", "e1")
    assert [FolderSource(tmp_path / "pranet").case_id(i) for i in range(3)] == ["0", "1", "2"]
    (tmp_path / "t2" / "TestDataset").mkdir(parents=True)
    _pair(tmp_path / "t2" / "TestDataset" / "Kvasir", "k1")
    assert FolderSource(tmp_path / "t2").case_id(0) == "Kvasir/k1"
    # CVC-ClinicDB original: Original/ + Ground Truth/ TIFs; PolypGen: <stem>_mask.jpg RGB masks
    for d in ("Original", "Ground Truth"):
        (tmp_path / "cvc" / d).mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "cvc" / "Original" / "1.tif"), np.full((12, 10, 3), 80, np.uint8))
    m = np.zeros((12, 10, 3), np.uint8)
    m[:4, :4] = 250
    cv2.imwrite(str(tmp_path / "cvc" / "Ground Truth" / "1_mask.tif"), m)
    img, mask = FolderSource(tmp_path / "cvc").load(0)
    assert img.shape == (12, 10, 3) and mask.sum() == 16
    dm = PolypDataModule(
        root=str(tmp_path / "pranet"),
        image_size=8,
        batch_size=2,
        extra_val={"etis": str(tmp_path / "pranet" / "TestDataset" / "ETIS")},
    )
    dm.setup("fit")
    assert len(dm.train_dataset) == 2 and len(dm.val_dataset) == 1
    assert next(iter(dm.extra_val_dataloaders()["etis"]))["case_id"] == ["e1"]
