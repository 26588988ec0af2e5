"""Shared dataset wrapper, case-level split and the base LightningDataModule.

A *source* is anything with ``__len__``, ``load(i) -> (image, mask)`` (image HWC uint8 or float32
in [0,1]; mask HW uint8 class indices), ``case_id(i)`` and ``slice_index(i)`` (both cheap, no
decoding), and optionally ``hard_cases`` (``{case_id: kind}``). Synthetic generators and the real-data
readers are sources; :class:`SegmentationDataset` adds the Albumentations pipeline and the batch dict
of ``docs/design.md``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override

from robusttrain.validate import check_choice, check_fraction, check_int

from .errors import DataError
from .transforms import RESIZE_MODES, apply_pipeline, build_pipeline, seed_pipeline


def _folder(owner: str, key: str, value: Any) -> str:
    if not Path(str(value)).expanduser().is_dir():
        raise DataError(f"{owner}: {key}={str(value)!r}: folder does not exist")
    return str(Path(str(value)).expanduser())


class SegmentationDataset(Dataset):
    """A view of ``source`` (optionally a subset ``indices``) yielding design.md sample dicts.

    Example::

        >>> from robusttrain.datamodules.synthetic_polyp import SyntheticPolypSource
        >>> ds = SegmentationDataset(SyntheticPolypSource(4, image_size=64), image_size=64)
        >>> s = ds[0]; s["image"].shape, s["mask"].dtype, s["case_id"]
        (torch.Size([3, 64, 64]), torch.int64, 'synpolyp_0000')
    """

    def __init__(
        self,
        source: Any,
        indices: Sequence[int] | None = None,
        transforms: Sequence | None = None,
        image_size: int | None = None,
        resize: str = "stretch",
        seed: int | None = 0,
    ):
        self.source = source
        self.indices = list(range(len(source))) if indices is None else [int(i) for i in indices]
        self.image_size = image_size
        # seeded: an unseeded Compose draws a fresh random state, so two runs would differ
        self.pipeline = build_pipeline(transforms, image_size, resize, seed=seed)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        j = self.indices[i]
        image, mask = self.source.load(j)
        img, msk = apply_pipeline(self.pipeline, image, mask, self.image_size)
        return {
            "image": torch.from_numpy(img),
            "mask": torch.from_numpy(msk),
            "case_id": self.source.case_id(j),
            "slice_index": int(self.source.slice_index(j)),
        }

    def sample_case_ids(self) -> list[str]:
        """Case id of every sample, in sample order."""
        return [self.source.case_id(j) for j in self.indices]

    def case_ids(self) -> list[str]:
        """Unique case ids in order of first appearance (a case = a patient/phase or a 2-D image)."""
        return list(dict.fromkeys(self.sample_case_ids()))

    @property
    def hard_cases(self) -> dict[str, str]:
        """Planted hard cases in this view: ``{case_id: kind}`` (synthetic sources only)."""
        planted = getattr(self.source, "hard_cases", {}) or {}
        mine = set(self.case_ids())
        return {c: k for c, k in planted.items() if c in mine}


def collate_samples(batch: list) -> Any:
    """torch's default collate, after checking that the batch's images have one size: with
    ``resize='none'`` and images of several sizes it would fail deep inside torch.stack.

    >>> collate_samples([{"image": torch.zeros(3, 4, 4), "case_id": "a"}])["image"].shape
    torch.Size([1, 3, 4, 4])
    """
    if batch and all(isinstance(b, dict) and torch.is_tensor(b.get("image")) for b in batch):
        first = batch[0]
        odd = next((b for b in batch if b["image"].shape != first["image"].shape), None)
        if odd is not None:
            raise DataError(
                f"images of different sizes in one batch: case {first.get('case_id')!r} is "
                f"{tuple(first['image'].shape)}, case {odd.get('case_id')!r} is "
                f"{tuple(odd['image'].shape)}; set data.resize=stretch or letterbox (with "
                "data.image_size), or data.batch_size=1"
            )
    return torch.utils.data.default_collate(batch)


def check_one_size(source: Any, root: Any) -> None:
    """``resize='none'`` promises the images are used as they are, so they must share one size:
    DataError naming two files that differ (sizes read from the file headers, nothing decoded)."""
    pairs = getattr(source, "pairs", None)
    if not pairs:
        return  # volumes and other sources: their own readers check shapes
    from PIL import Image, UnidentifiedImageError

    sizes: dict[tuple[int, int], list[str]] = {}
    for ip, _mp, _cid in pairs:
        try:
            with Image.open(ip) as im:
                sizes.setdefault(im.size, []).append(Path(ip).name)
        except (UnidentifiedImageError, OSError, ValueError):
            continue  # the reader names a file it cannot read when it loads it
    if len(sizes) > 1:
        (s1, f1), (s2, f2) = sorted(sizes.items(), key=lambda kv: -len(kv[1]))[:2]
        raise DataError(
            f"data.resize=none but the images in {root} differ in size: {len(f1)} are {s1[0]}x{s1[1]} "
            f"(e.g. {f1[0]}), {len(f2)} are {s2[0]}x{s2[1]} (e.g. {f2[0]})"
            + (f", {len(sizes) - 2} more size(s)" if len(sizes) > 2 else "")
            + "; use data.resize=stretch or data.resize=letterbox (to data.image_size)"
        )


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: seed numpy, ``random`` and the dataset's Albumentations pipeline.

    Each worker holds a copy of the pipeline with the parent's random state; without reseeding
    every worker would replay the same augmentations. The seed is torch's per-worker seed (drawn
    from the loader's seeded generator, + worker id) mixed with the process rank, so it is the
    same in every run with the same seed and differs between workers and ranks.
    """
    info = torch.utils.data.get_worker_info()
    assert info is not None  # the loaders' worker_init_fn: it runs in a worker
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", 0)))
    s = (info.seed + 1_000_003 * rank) % 2**32
    np.random.seed(s)
    random.seed(s)
    pipeline = getattr(info.dataset, "pipeline", None)
    if hasattr(pipeline, "set_random_state"):
        seed_pipeline(pipeline, s)


def split_by_case(case_ids: Sequence[str], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Seeded split of sample indices so that every case lies wholly on one side.

    At least one case goes to each side when there are two or more cases.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction={val_fraction}: expected 0 <= val_fraction < 1")
    cases = sorted(set(case_ids))  # sorted: the split must not depend on file-system order
    n_val = int(round(val_fraction * len(cases)))
    if val_fraction > 0 and len(cases) >= 2:
        n_val = min(max(n_val, 1), len(cases) - 1)
    perm = np.random.default_rng(seed).permutation(len(cases))
    val_cases = {cases[k] for k in perm[:n_val]}
    train = [i for i, c in enumerate(case_ids) if c not in val_cases]
    val = [i for i, c in enumerate(case_ids) if c in val_cases]
    return train, val


class BaseSegDataModule(L.LightningDataModule):
    """Split/loader logic shared by the polyp, ACDC and CXR datamodules.

    Subclasses set ``class_names``, ``in_channels``, default transforms, ``synthetic_source`` (or override
    ``_synthetic_sources()`` → (train_source, val_source)) and implement ``_read(folder)`` → source.
    With ``root=None`` the synthetic set is used (``n_train``/``n_val`` items, default
    ``default_n_train``/``default_n_val``, ``hard_fraction`` planted hard cases); otherwise ``root`` is
    read and split by case with ``val_fraction``/``seed``
    (``val_fraction=0``: validate on the training data). ``test_dataloader``/``predict_dataloader``
    serve the validation split. Transforms: see :mod:`robusttrain.datamodules.transforms`; ``resize``
    (``stretch``/``letterbox``/``none``) runs first, to ``image_size``².
    """

    class_names: list[str] = []
    in_channels: int = 3
    default_train_transforms: list = []
    default_resize: str = "stretch"
    default_n_train: int = 200
    default_n_val: int = 50
    # called as synthetic_source(n, seed, image_size, hard_fraction, start_index)
    synthetic_source: Any = None

    def __init__(
        self,
        root: str | None = None,
        image_size: int = 128,
        batch_size: int = 8,
        num_workers: int = 0,
        val_fraction: float = 0.2,
        seed: int = 0,
        extra_val: dict[str, str] | None = None,
        n_train: int | None = None,
        n_val: int | None = None,
        hard_fraction: float = 0.1,
        train_transforms: Sequence | None = None,
        val_transforms: Sequence | None = None,
        resize: str | None = None,
        pin_memory: bool = False,
    ):
        super().__init__()
        # every value is checked here, so a bad recipe fails before any data is read
        name = type(self).__name__
        self.root = None if root in (None, "", "null", "None") else _folder(name, "root", root)
        self.image_size = check_int(
            "image_size", image_size, 1, owner=name, why="the square training size in pixels"
        )
        self.batch_size = check_int("batch_size", batch_size, 1, owner=name)
        self.num_workers = check_int(
            "num_workers", num_workers, 0, owner=name, why="0 = load in the main process"
        )
        self.val_fraction = check_fraction(
            "val_fraction", val_fraction, hi_open=True, owner=name, why="0 = validate on the training data"
        )
        self.seed = check_int("seed", seed, None, owner=name)
        if extra_val is not None and not hasattr(extra_val, "items"):
            raise ValueError(f"{name}: extra_val={extra_val!r}: expected a mapping name -> folder")
        self.extra_val = {
            str(k): _folder(name, f"extra_val[{k!r}]", v) for k, v in dict(extra_val or {}).items()
        }
        n_train = self.default_n_train if n_train is None else n_train
        n_val = self.default_n_val if n_val is None else n_val
        self.n_train = check_int("n_train", n_train, 1, owner=name, why="synthetic training items")
        self.n_val = check_int("n_val", n_val, 1, owner=name, why="synthetic validation items")
        self.hard_fraction = check_fraction("hard_fraction", hard_fraction, owner=name)
        self.train_transforms = (
            self.default_train_transforms if train_transforms is None else train_transforms
        )
        self.val_transforms = val_transforms or []
        self.resize = resize or self.default_resize
        check_choice("resize", self.resize, RESIZE_MODES, owner=name)
        if not isinstance(pin_memory, bool):
            raise ValueError(f"{name}: pin_memory={pin_memory!r}: expected true or false")
        self.pin_memory = pin_memory
        for key in ("train_transforms", "val_transforms"):  # a typo in a transform name fails now
            try:
                build_pipeline(getattr(self, key), self.image_size, self.resize)
            except DataError as e:
                raise DataError(f"{name}: {key}: {e}") from None
            except (TypeError, ValueError) as e:
                raise ValueError(f"{name}: {key}: {str(e).splitlines()[0]}") from None
        self.train_dataset: SegmentationDataset | None = None
        self.val_dataset: SegmentationDataset | None = None
        self._extra: dict[str, SegmentationDataset] | None = None
        self._train_wrap: Any = None
        self._train_generator: torch.Generator | None = None
        self._resume_rng: dict[str, Any] | None = None
        # what val_dataloader serves: "val" (the split; always in fit) or "all" (whole_dataset), set by
        # the CLI's validate / test on a data.root folder
        self.eval_split = "val"

    # --- what subclasses provide -------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return len(self.class_names) + 1

    def _synthetic_sources(self) -> tuple[Any, Any]:
        if self.synthetic_source is None:
            raise NotImplementedError(f"{type(self).__name__}: no synthetic_source")
        # generated at the training size: resizing afterwards would only cost time
        mk = lambda n, start: self.synthetic_source(n, self.seed, self.image_size, self.hard_fraction, start)
        return mk(self.n_train, 0), mk(self.n_val, self.n_train)

    def _read(self, folder: str) -> Any:
        raise NotImplementedError

    def _split_key(self, case_id: str) -> str:
        """Samples with the same key land on the same side of the split (default: the case)."""
        return case_id

    # --- datasets ----------------------------------------------------------------------------
    def _view(self, source: Any, indices: Sequence[int] | None, train: bool) -> SegmentationDataset:
        tf = self.train_transforms if train else self.val_transforms
        return SegmentationDataset(
            source, indices, tf, self.image_size, self.resize, seed=self.seed + (not train)
        )

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_dataset is not None:
            return  # idempotent: Lightning calls setup for fit, validate and test
        if self.root is None:
            tr, va = self._synthetic_sources()
            self.train_dataset, self.val_dataset = self._view(tr, None, True), self._view(va, None, False)
            return
        source = self._read(self.root)
        ids = [self._split_key(source.case_id(i)) for i in range(len(source))]
        tr_idx, va_idx = split_by_case(ids, self.val_fraction, self.seed)
        if not tr_idx:
            raise DataError(f"{self.root}: too few cases ({len(set(ids))}) to split off a validation set")
        if self.resize == "none":
            check_one_size(source, self.root)
        self.train_dataset = self._view(source, tr_idx, True)
        self.val_dataset = self._view(source, va_idx or tr_idx, False)

    @property
    def mask_encoding(self) -> str | None:
        """The mask encoding in use after ``setup`` (``binary255``/``class_index``, detected when
        ``mask_mode="auto"``); None for synthetic data, volumes, or before setup."""
        src = getattr(self.train_dataset, "source", None)
        return getattr(src, "mask_mode", None)

    @property
    def planted_hard_cases(self) -> list[str]:
        """Case ids of planted corner cases (train and val); ``[]`` for real data."""
        return sorted(self.planted_hard_kinds)

    @property
    def planted_hard_kinds(self) -> dict[str, str]:
        """``{case_id: kind}`` of the planted corner cases."""
        if self.root is not None:
            return {}
        self.setup("fit")
        assert self.train_dataset is not None and self.val_dataset is not None  # setup("fit") made them
        return {**self.train_dataset.hard_cases, **self.val_dataset.hard_cases}

    # --- resume: the training RNG travels in the checkpoint --------------------------------------
    @override
    def state_dict(self) -> dict[str, Any]:
        """Saved in every Lightning checkpoint: the shuffle generator and the global RNG states, as
        they are when the checkpoint is written (end of an epoch), so a resumed run draws the next
        epoch's order, augmentations and replay slots exactly as the uninterrupted run does."""
        from robusttrain.checkpoints import rng_state

        state = {"rng": rng_state(self._train_generator)}
        gen, py = self._augmentation_streams()
        if gen is not None and py is not None:  # the train pipeline's own streams (in-process loading)
            state["augment"] = {"numpy": gen.bit_generator.state, "python": py.getstate()}
        return state

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_rng = state  # applied when the resumed run builds its train loader

    def _augmentation_streams(self) -> tuple[Any, Any]:
        pipe = getattr(self.train_dataset, "pipeline", None)
        return getattr(pipe, "random_generator", None), getattr(pipe, "py_random", None)

    def _apply_resume_state(self, generator: torch.Generator) -> None:
        from robusttrain.checkpoints import set_rng_state

        state, self._resume_rng = self._resume_rng, None
        assert state is not None  # called only with a resume state
        if state.get("rng") is not None:
            set_rng_state(state["rng"], generator)
        gen, py = self._augmentation_streams()
        aug = state.get("augment")
        if aug is not None and gen is not None and py is not None:  # in place: every transform shares them
            gen.bit_generator.state = aug["numpy"]
            py.setstate((aug["python"][0], tuple(aug["python"][1]), aug["python"][2]))

    # --- loaders -----------------------------------------------------------------------------
    def _loader(self, ds: Any, shuffle: bool) -> DataLoader:
        # seeded for every loader: it also draws the workers' base seed (see seed_worker)
        g = torch.Generator().manual_seed(self.seed)
        if shuffle:
            self._train_generator = g
            if self._resume_rng is not None:
                self._apply_resume_state(g)
        # drop a lone trailing sample: BatchNorm models fail on a batch of one
        drop_last = shuffle and len(ds) > self.batch_size and len(ds) % self.batch_size == 1
        return DataLoader(
            ds,
            batch_size=self.batch_size,
            shuffle=shuffle,
            generator=g,
            drop_last=drop_last,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            pin_memory=self.pin_memory,
            worker_init_fn=seed_worker if self.num_workers else None,
            collate_fn=collate_samples,
        )

    def wrap_train(self, wrap: Any) -> None:
        """Build the train loader over ``wrap(train_dataset)`` (e.g. ``FailureMiningCallback.wrap``,
        which replays mined failures); ``train_dataset`` itself stays the plain dataset."""
        self._train_wrap = wrap

    @override
    def train_dataloader(self) -> DataLoader:
        self.setup("fit")
        ds = self.train_dataset if self._train_wrap is None else self._train_wrap(self.train_dataset)
        return self._loader(ds, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader:
        self.setup("fit")
        if self.eval_split == "all":  # validate / test scoring a whole folder (never during fit)
            return self._loader(self.whole_dataset(), shuffle=False)
        return self._loader(self.val_dataset, shuffle=False)

    @override
    def test_dataloader(self) -> DataLoader:
        """The validation split (there is no separate held-out split)."""
        return self.val_dataloader()

    def whole_dataset(self) -> SegmentationDataset:
        """Every case of ``root`` (both sides of the split) with the validation pipeline, for scoring a
        folder as a whole (``check`` / ``validate`` / ``test`` with ``data.root``); the validation split
        when the data are synthetic (their training cases are generated, not a folder the user named)."""
        self.setup("fit")
        assert self.train_dataset is not None and self.val_dataset is not None
        if self.root is None:
            return self.val_dataset
        return self._view(self.train_dataset.source, None, False)

    @override
    def predict_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def extra_val_datasets(self) -> dict[str, SegmentationDataset]:
        if self._extra is None:
            self._extra = {
                name: self._view(self._read(folder), None, False) for name, folder in self.extra_val.items()
            }
        return self._extra

    def extra_val_dataloaders(self) -> dict[str, DataLoader]:
        """Named extra validation loaders (e.g. ``{"etis": ...}``), val pipeline, fixed order."""
        return {name: self._loader(ds, shuffle=False) for name, ds in self.extra_val_datasets().items()}
