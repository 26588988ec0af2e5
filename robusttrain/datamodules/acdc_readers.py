"""ACDC readers: SSL4MIS-style HDF5 (``*.h5`` with ``image``/``label``) and the original NIfTI layout.

* HDF5: volumes ``patientXXX_frameYY.h5`` (slices × H × W) or per-slice files
  ``patientXXX_frameYY_slice_N.h5`` (a case's volume file wins if both exist).
* NIfTI: ``patientXXX/patientXXX_frameYY.nii.gz`` + ``patientXXX_frameYY_gt.nii.gz``; ED/ES from the
  patient's ``Info.cfg`` when present.
Phases: per patient the labelled frames are sorted; without ``Info.cfg`` the first is ED, the
second ES (SSL4MIS ``frame01``/``frame02``), further ones ``frameYY``. Case id ``patient011_ED``.
Images are min-max normalised per volume when not already in [0,1]; labels must lie in 0..3.

Example::

    >>> src = open_acdc("/path/to/acdc")                               # doctest: +SKIP
    >>> image, label = src.load(0); src.case_id(0), src.slice_index(0)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError

NUM_CLASSES = 4
_NAME = re.compile(r"(patient\d+)_frame(\d+)(?:_slice_(\d+))?$")


def _stem(p: Path) -> str:
    name = p.name
    for ext in (".nii.gz", ".nii", ".h5", ".hdf5"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return p.stem


def _info_cfg(folder: Path) -> dict[int, str]:
    cfg = folder / "Info.cfg"
    out: dict[int, str] = {}
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, val = line.partition(":")
            if key.strip() in ("ED", "ES") and val.strip().isdigit():
                out[int(val.strip())] = key.strip()
    return out


def _phase_names(frames_by_patient: dict[str, set[int]], cfg: dict[str, dict[int, str]]) -> dict[tuple, str]:
    names = {}
    for pat, frames in frames_by_patient.items():
        known = cfg.get(pat, {})
        for k, f in enumerate(sorted(frames)):
            default = ("ED", "ES")[k] if k < 2 and not known else f"frame{f:02d}"
            names[(pat, f)] = known.get(f, default)
    return names


def _check(image: np.ndarray, label: np.ndarray, path: Path) -> tuple[np.ndarray, np.ndarray]:
    if image.shape != label.shape:
        raise DataError(f"{path}: image shape {image.shape} differs from label shape {label.shape}")
    if not np.isfinite(image).all():
        raise DataError(f"{path}: image contains NaN or inf values")
    if not np.isfinite(label).all():
        raise DataError(
            f"{path}: label contains NaN or inf values (expected class indices 0..{NUM_CLASSES - 1})"
        )
    lab = np.rint(label)
    if not np.array_equal(lab, label):
        odd = np.asarray(label)[lab != label]
        raise DataError(
            f"{path}: label values are not whole numbers (e.g. {float(odd.flat[0]):g}, {odd.size} "
            "voxels); a label map resampled with linear interpolation? resample labels with "
            "nearest neighbour"
        )
    if lab.size and (lab.min() < 0 or lab.max() >= NUM_CLASSES):
        raise DataError(
            f"{path}: label values {sorted(np.unique(lab).astype(int).tolist())} outside the class "
            f"range 0..{NUM_CLASSES - 1} (bg, RV, MYO, LV)"
        )
    image = image.astype(np.float32)
    lo, hi = float(image.min()), float(image.max())
    if lo < 0 or hi > 1:  # raw MRI intensities: per-volume min-max as in the SSL4MIS preprocessing
        image = (image - lo) / max(hi - lo, 1e-6)
    return image, lab.astype(np.uint8)


def _nifti(path: Path) -> Any:
    """``nibabel.load`` (a NIfTI image: ``shape``, ``dataobj``)."""
    import nibabel as nib

    return nib.load(str(path))


class _VolumeSource:
    """Shared slice indexing + per-file cache; subclasses implement ``_read(path)`` → (image, label)."""

    def __init__(self, root: Path, entries: list[tuple[Path, str, int | None, int]]):
        # entries: (file, case_id, slice within file or None for a 2-D file, slice index in the case)
        if not entries:
            raise DataError(f"ACDC folder {root}: empty dataset (no labelled volumes found)")
        self.root, self.entries = root, entries
        self._cache: dict[Path, tuple[np.ndarray, np.ndarray]] = {}

    def _read(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError  # each source reads its own files

    def __len__(self) -> int:
        return len(self.entries)

    def case_id(self, i: int) -> str:
        return self.entries[i][1]

    def slice_index(self, i: int) -> int:
        return self.entries[i][3]

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        path, _, k, _ = self.entries[i]
        if path not in self._cache:  # volumes are a few MB: keep every decoded one
            self._cache[path] = self._read(path)
        img, lab = self._cache[path]
        return (img, lab) if k is None else (img[k], lab[k])


class H5Source(_VolumeSource):
    """ACDC in SSL4MIS HDF5 form (see module doc)."""

    def __init__(self, root: str | Path):
        import h5py

        root = Path(root)
        files = sorted(root.rglob("*.h5"))
        parsed, frames, plain = {}, defaultdict(set), []
        for f in files:
            m = _NAME.match(_stem(f))
            if m:
                parsed[f] = (m.group(1), int(m.group(2)), None if m.group(3) is None else int(m.group(3)))
                frames[m.group(1)].add(int(m.group(2)))
            else:
                plain.append(f)
        names = _phase_names(frames, {})
        has_volume = {(p, fr) for p, fr, s in parsed.values() if s is None}
        entries: list[tuple[Path, str, int | None, int]] = []
        for f in files:
            shape = self._shape(f, h5py)
            if f in parsed:
                pat, fr, s = parsed[f]
                if s is not None and (pat, fr) in has_volume:
                    continue
                case = f"{pat}_{names[(pat, fr)]}"
            else:
                case, s = _stem(f), None
            if len(shape) == 3:
                entries += [(f, case, k, k) for k in range(shape[0])]
            else:
                entries.append((f, case, None, s or 0))
        entries.sort(key=lambda e: (e[1], e[3]))
        super().__init__(root, entries)

    @staticmethod
    def _shape(f: Path, h5py) -> tuple:
        try:
            with h5py.File(f, "r") as h:
                missing = [k for k in ("image", "label") if k not in h]
                if missing:
                    raise DataError(
                        f"HDF5 file {f}: missing dataset(s) {missing} (expected 'image' and 'label')"
                    )
                if h["image"].shape != h["label"].shape:
                    raise DataError(
                        f"HDF5 file {f}: image shape {h['image'].shape} differs from label "
                        f"shape {h['label'].shape}"
                    )
                if len(h["image"].shape) not in (2, 3):  # e.g. a trailing channel dimension (D, H, W, 1)
                    raise DataError(
                        f"HDF5 file {f}: image shape {h['image'].shape}; expected a (D, H, W) "
                        "volume or an (H, W) slice (drop extra dimensions)"
                    )
                return h["image"].shape
        except OSError as e:
            raise DataError(f"cannot read HDF5 file {f} (corrupt or not HDF5: {e})") from None

    def _read(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        import h5py

        try:
            with h5py.File(path, "r") as h:
                return _check(h["image"][()], h["label"][()], path)
        except OSError as e:
            raise DataError(f"cannot read HDF5 file {path} (corrupt: {e})") from None


class NiftiSource(_VolumeSource):
    """ACDC in its original NIfTI layout (see module doc)."""

    def __init__(self, root: str | Path):

        root = Path(root)
        images = sorted(p for p in root.rglob("patient*_frame*.nii*") if "_gt" not in p.name)
        import nibabel  # noqa: F401 -- a missing nibabel fails here, not as an unreadable file

        frames: defaultdict[str, set[int]] = defaultdict(set)
        cfg: dict[str, Any] = {}
        found: list[tuple[Path, Path, str, int]] = []
        for im in images:
            m = _NAME.match(_stem(im))
            if not m:
                continue
            gt = im.with_name(_stem(im) + "_gt" + im.name[len(_stem(im)) :])
            if not gt.exists():
                raise DataError(f"image {im} has no label file {gt.name} beside it")
            pat, fr = m.group(1), int(m.group(2))
            frames[pat].add(fr)
            cfg.setdefault(pat, _info_cfg(im.parent))
            found.append((im, gt, pat, fr))
        names = _phase_names(frames, cfg)
        entries, self._gt = [], {}
        for im, gt, pat, fr in found:
            try:
                shape = _nifti(im).shape
            except Exception as e:  # nibabel raises several types for broken headers
                raise DataError(f"cannot read NIfTI file {im} ({e})") from None
            self._gt[im] = gt
            n = shape[2] if len(shape) >= 3 else 1
            entries += [
                (im, f"{pat}_{names[(pat, fr)]}", k if len(shape) >= 3 else None, k) for k in range(n)
            ]
        super().__init__(root, entries)

    def _read(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        import nibabel  # noqa: F401 -- a missing nibabel fails here, not as an unreadable file

        try:
            img = np.asarray(_nifti(path).dataobj, dtype=np.float32)
            lab = np.asarray(_nifti(self._gt[path]).dataobj, dtype=np.float32)
        except Exception as e:
            raise DataError(f"cannot read NIfTI file {path} or its label ({e})") from None
        if img.ndim == 3:  # (X, Y, Z) → (Z, Y, X), the orientation of the SSL4MIS HDF5 files
            img, lab = img.transpose(2, 1, 0), lab.transpose(2, 1, 0)
        else:
            img, lab = img.T, lab.T
        return _check(img, lab, path)


def open_acdc(root: str | Path) -> _VolumeSource:
    """Pick the reader from what ``root`` holds."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"ACDC folder {root} does not exist")
    if next(root.rglob("*.h5"), None) is not None:
        return H5Source(root)
    if next(root.rglob("patient*_frame*.nii*"), None) is not None:
        return NiftiSource(root)
    raise DataError(
        f"ACDC folder {root}: empty dataset (expected *.h5 files with 'image'/'label' or "
        f"patientXXX/patientXXX_frameYY.nii.gz with _gt labels)"
    )
