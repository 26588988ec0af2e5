"""Issue 20, part 3: data readers refuse what they cannot read correctly, naming the file (or read it
correctly when told how). Real files written with OpenCV / h5py, read by the real readers."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest

from robusttrain.datamodules.acdc_readers import _check
from robusttrain.datamodules.errors import DataError
from robusttrain.datamodules.readers import MAX_PIXELS, FolderSource


def _img(path: Path, value=100, dtype=np.uint8, size=(8, 8)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full(size, value, dtype))


def _pair(root: Path, stem: str, ext: str = ".png", mask_name: str | None = None) -> None:
    _img(root / "images" / f"{stem}{ext}")
    _img(root / "masks" / (mask_name or f"{stem}.png"), 255)


def _bomb(path: Path, w: int, h: int) -> None:
    """A real 8x8 PNG whose header is rewritten to declare ``w`` x ``h`` pixels (CRC fixed)."""
    _img(path)
    data = bytearray(path.read_bytes())
    ihdr = data[12:29]
    ihdr[4:12] = struct.pack(">II", w, h)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)) & 0xFFFFFFFF)
    path.write_bytes(bytes(data))


@dataclass
class D:
    id: str
    make: Callable[[Path], None]
    text: str | None  # DataError text; None: it loads and ``check`` holds
    kwargs: dict | None = None
    check: Callable[[FolderSource], None] | None = None


def _dup_ids(r):
    _pair(r, "a", ".jpg")
    _img(r / "images" / "a.png")


def _two_masks(r):
    _pair(r, "a")
    _img(r / "masks" / "a_mask.png", 255)


def _twelve_bit(r):
    _img(r / "images" / "a.png", 4095, np.uint16)
    _img(r / "masks" / "a.png", 255)


def _sixteen_bit_small(r):
    _img(r / "images" / "a.png", 200, np.uint16)
    _img(r / "masks" / "a.png", 255)


def _image_bomb(r):
    _bomb(r / "images" / "a.png", 20000, 20000)
    _img(r / "masks" / "a.png", 255)


def _mask_bomb(r):
    _img(r / "images" / "a.png")
    _bomb(r / "masks" / "a.png", 12000, 12000)


def _value(v):
    def check(src):
        assert int(src.load(0)[0].max()) == v and src.load(0)[0].dtype == np.uint8

    return check


DATA = [
    D("duplicate-case-id-jpg-png", _dup_ids, "two images with case id 'a': "),
    D("two-masks-for-one-image", _two_masks, "more than one mask for image 'a': "),
    D(
        "12-bit-in-16-bit-png",
        _twelve_bit,
        "is 16-bit with values up to 4095 (12 significant bits); set data.image_bits=12",
    ),
    D("12-bit-with-image-bits-12", _twelve_bit, None, {"image_bits": 12}, _value(255)),
    D("16-bit-png-with-8-bit-values", _sixteen_bit_small, None, None, _value(200)),
    D(
        "image-bomb-400-megapixels",
        _image_bomb,
        f"declares 20000x20000 pixels, more than the limit of {MAX_PIXELS:,}",
    ),
    D("mask-bomb-144-megapixels", _mask_bomb, "declares 12000x12000 pixels"),
]


@pytest.mark.parametrize("d", DATA, ids=[d.id for d in DATA])
def test_folder_reader(d: D, tmp_path):
    d.make(tmp_path)
    if d.text is None:
        d.check(FolderSource(tmp_path, **(d.kwargs or {})))
        return
    with pytest.raises(DataError) as err:  # refused when the folder is read, or when the sample is
        FolderSource(tmp_path, mask_mode="binary255", **(d.kwargs or {})).load(0)
    assert d.text in str(err.value) and str(tmp_path) in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


LABELS = [
    ("nan", np.nan, "label contains NaN or inf values"),
    ("inf", np.inf, "label contains NaN or inf values"),
    ("fraction-0.25", 0.25, "label values are not whole numbers (e.g. 0.25"),
    ("fraction-1.75", 1.75, "label values are not whole numbers (e.g. 1.75"),
]


@pytest.mark.parametrize(("value", "text"), [(v, t) for _, v, t in LABELS], ids=[i for i, _, _ in LABELS])
def test_acdc_labels_that_are_not_class_indices_are_refused(value, text, tmp_path):
    label = np.zeros((4, 4, 2), np.float32)
    label[1, 1, 0] = value
    with pytest.raises(DataError) as err:
        _check(np.ones((4, 4, 2), np.float32), label, tmp_path / "p1.h5")
    assert text in str(err.value) and "p1.h5" in str(err.value)


def test_acdc_whole_number_float_labels_still_load(tmp_path):
    label = np.zeros((4, 4, 2), np.float32)
    label[1, 1, 0] = 3.0
    _, lab = _check(np.ones((4, 4, 2), np.float32), label, tmp_path / "p1.h5")
    assert lab.dtype == np.uint8 and int(lab.max()) == 3


@pytest.mark.parametrize("shape", [(2, 8, 8, 1), (8,)], ids=["trailing-dimension", "one-dimensional"])
def test_hdf5_volume_of_another_shape_is_refused_naming_the_file(shape, tmp_path):
    import h5py

    from robusttrain.datamodules.acdc_readers import H5Source

    with h5py.File(tmp_path / "patient001_frame01.h5", "w") as h:
        h["image"], h["label"] = np.zeros(shape, np.float32), np.zeros(shape, np.uint8)
    with pytest.raises(DataError) as err:
        H5Source(tmp_path)
    assert f"patient001_frame01.h5: image shape {shape}; expected a (D, H, W) volume" in str(err.value)


def test_a_checkpoint_s_hyper_parameters_are_shown_only_as_short_plain_values():
    # the refusal of a checkpoint for another model names the settings it was written with; they come from
    # the file, so only short plain values are shown (no escape codes, spaces, nesting, long lists)
    from robusttrain.checkpoints import settings_hint

    mine = {"network": "basic_unet", "features": [8, 8, 16, 16, 32, 8], "norm": None, "backbone": None}
    hostile = {
        "network": "\x1b[31mswin unetr",
        "features": [[1, 2]],
        "norm": {"__class__": "x"},
        "backbone": "a" * 41,
        "in_channels": 1,
    }
    assert settings_hint(hostile, {**mine, "in_channels": 3}) == (
        "; the file was written with model.in_channels=1 (this model: 3)"
    )
    assert settings_hint(hostile, {**mine, "in_channels": 1}) == ""  # nothing printable differs
    assert settings_hint(["not", "a", "dict"], mine) == "" and settings_hint(mine, mine) == ""
