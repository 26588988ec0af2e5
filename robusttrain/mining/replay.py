"""Training-set wrappers that add perturbed samples to every epoch: mined-failure replay and its
random-augmentation baseline.

Both wrappers keep the wrapped dataset's length and indices. While they have something to add,
each sample of an epoch is, with probability ``ratio`` (0.2 by default), replaced by a perturbed
*slot* sample; otherwise it is the original sample. The length never changes (samplers, DDP and
Lightning's batch count stay as they are), and a replay wrapper with an empty bank returns exactly
the original samples without drawing a random number, so training is unchanged until the first
failure is mined. Anything that indexes the wrapped dataset itself (e.g. a metamorphic probe) sees
the original samples. Slots are returned in the wrapped dataset's own sample format
(:class:`~robusttrain.mining.samples.SampleCodec`): robusttrain's datasets give their dict, any
other map-style dataset (``Subset`` included) its own dict / tuple with the image replaced.

* :class:`ReplayDataset` fills a slot with a mined failure: it picks a perturbation by the
  failure-driven weights (``failures/sampling.json``, see :mod:`.sampling`), a failure of it with
  probability proportional to its Dice drop, and re-creates the failing image from the *clean*
  training image (resize only, no augmentation — the view the probe checks) with the recorded
  perturbation, severity and params, mask unchanged; the training augmentations then run on top.
  Jitter (``jitter``, default 0.1): every float-valued param is moved a random fraction
  ``alpha ~ U(0, jitter)`` of the way toward a freshly sampled valid value of the same
  perturbation; integer params (seeds, counts, shape/character codes, cast choice) are kept. So a
  replay stays inside the perturbation's valid range and close to the failure. ``jitter=0`` replays
  exactly. Two optional ways to learn the artifact *family* rather than memorise a few failing
  images: ``fresh_image`` (default 0) is the probability that a slot applies the chosen failure's
  perturbation x severity with fresh random params to a random training image instead, and
  ``clean_mix`` (default 0) the probability that it holds the failure's clean source image
  (un-perturbed, augmented), a paired clean copy that keeps the clean fit of the replayed cases.
  The bank is read from ``<run_dir>/failures/`` whenever its files change (checked with
  ``os.stat`` per slot), so each DataLoader worker — persistent or not — and each DDP rank sees new
  failures in the epoch after they were mined. Slots fall back to a clean random sample while the
  bank holds nothing trainable.
* :class:`RandomPerturbationDataset` fills a slot with a random perturbation x severity with
  random params on a random training sample (the standard-augmentation baseline); with an empty
  perturbation list the slots are clean duplicates (the plain baseline with the same budget).

>>> import tempfile, torch
>>> class Toy(torch.utils.data.Dataset):
...     def __len__(self): return 8
...     def __getitem__(self, i):
...         return {"image": torch.full((3, 16, 16), i / 8), "mask": torch.zeros(16, 16, dtype=torch.long),
...                 "case_id": f"c{i}", "slice_index": 0}
>>> ds = ReplayDataset(Toy(), tempfile.mkdtemp())
>>> len(ds), ds.n_slots, ds[7]["case_id"]  # 8 samples, ~2 replayed per epoch; empty bank: originals
(8, 2, 'c7')
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from robusttrain.metamorphic.batch import BatchHooks, HookError, SizedDataset
from robusttrain.metamorphic.records import FailureRecord
from robusttrain.mining.bank import FailureBank
from robusttrain.mining.crops import is_crop_list, read_seeded, rng_kept
from robusttrain.mining.samples import SampleCodec
from robusttrain.rundir import failures as failures_file
from robusttrain.rundir import sampling as sampling_file

_RESIZE_STEPS = ("Resize", "LongestMaxSize", "PadIfNeeded")


def apply_image(
    op: Any,
    img: np.ndarray,
    msk: np.ndarray,
    params: dict | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """``op`` on one HWC image, or slice-wise on an (S,H,W,C) volume with *one* set of params (drawn on
    its most-foreground slice when not given), as the metamorphic check perturbs volumes.

    >>> from robusttrain import perturbations as P
    >>> vol = np.full((4, 16, 16, 1), 120, np.uint8); vol[:, 4:10, 4:10] = 200
    >>> out = apply_image(P.get("contrast", severity=5), vol, np.zeros((4, 16, 16), np.int64), rng=np.random.default_rng(0))
    >>> out.shape, bool((out == out[0]).all())   # same params on every (identical) slice
    ((4, 16, 16, 1), True)
    """
    if img.ndim == 4:
        if params is None:
            j = representative_slice(msk)
            params = op.sample_numpy(img[j], msk[j], rng=rng)
        return np.stack([apply_image(op, img[k], msk[k], params) for k in range(img.shape[0])])
    out, _ = op.apply_numpy(img, mask=msk, params=params, rng=rng)
    return out[..., None] if out.ndim == 2 else out


def sample_params(op: Any, img: np.ndarray, msk: np.ndarray, rng: np.random.Generator) -> dict:
    """Fresh params for one image, or for a volume (on its representative slice)."""
    if img.ndim == 4:
        j = representative_slice(msk)
        return op.sample_numpy(img[j], msk[j], rng=rng)
    return op.sample_numpy(img, msk, rng=rng)


def representative_slice(msk: np.ndarray) -> int:
    """The slice with the most foreground (the middle one when empty): where the check draws params."""
    fg = (np.asarray(msk) > 0).reshape(len(msk), -1).sum(1)
    return int(fg.argmax()) if fg.max() > 0 else len(msk) // 2


def n_slots_for(n: int, ratio: float) -> int:
    """Expected replaced samples per epoch of ``n`` samples."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"ratio={ratio}: expected 0 <= ratio < 1")
    return int(round(n * ratio))


def to_uint8_hwc(image: Any) -> np.ndarray:
    """(C,H,W) float [0,1] tensor/array -> (H,W,C) uint8, the metamorphic probe's numpy input."""
    t = torch.as_tensor(image).detach().float().clamp(0, 1)
    return (t * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()


class CleanView:
    """Un-augmented access to a training dataset, and the augmentations to run afterwards.

    For robusttrain's ``SegmentationDataset`` (``source``, ``indices``, ``pipeline``) the clean
    image is ``source.load`` + the pipeline's leading resize steps; the remaining steps are the
    augmentations. Any other dataset: its own sample, read and rebuilt through ``hooks``
    (:class:`~robusttrain.mining.samples.SampleCodec`), and no extra steps.
    """

    def __init__(self, ds: SizedDataset, hooks: BatchHooks | None = None):
        self.ds = ds
        self.codec = SampleCodec(hooks)
        pipe = getattr(ds, "pipeline", None)
        self.pre = self.post = None
        self._crops: int | None = None  # crops per sample: 0 = plain samples, k = lists of k crops
        self._last: tuple[int, Any] | None = None  # the last crop list read (k reads of one volume)
        if pipe is not None and hasattr(ds, "source") and hasattr(ds, "indices"):
            import albumentations as A

            steps = list(pipe.transforms)
            k = 0
            while k < len(steps) and type(steps[k]).__name__ in _RESIZE_STEPS:
                k += 1
            self.pre = A.Compose(steps[:k])
            self.post = A.Compose(steps[k:]) if k < len(steps) else None
            # a new Compose reseeds its transforms from OS entropy; give them (shared with the
            # dataset's pipeline) the pipeline's seeded stream back, or runs stop being reproducible
            for c in (pipe, self.pre, self.post):
                if c is not None and hasattr(pipe, "random_generator"):
                    c.set_random_state(pipe.random_generator, pipe.py_random)

    @property
    def crops(self) -> int:
        """0 for plain samples, k when each sample is a list of k crops (read once, streams kept)."""
        if self._crops is None:
            first = read_seeded(self.ds, 0) if self.pre is None and len(self.ds) else None
            self._crops = len(first) if is_crop_list(first) else 0
        return self._crops

    def __len__(self) -> int:
        """Readable items: samples, or every crop of every sample (index ``i * k + j``)."""
        return len(self.ds) * max(1, self.crops)

    def sample(self, i: int) -> tuple[Any, dict[str, Any]]:
        """The client's item ``i`` (a sample, or crop ``i % k`` of the seeded crop list of sample
        ``i // k``) and what :meth:`finish` needs to rebuild the training sample around it."""
        k = self.crops
        if not k:
            sample = self.ds[i]
            return sample, {"sample": sample}
        src = i // k
        if self._last is None or self._last[0] != src:
            self._last = (src, read_seeded(self.ds, src))
        crops = self._last[1]
        return crops[i % k], {"sample": crops[i % k], "crops": crops, "crop": i % k}

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """(image HWC uint8, mask HW int64, meta with case_id/slice_index) of sample ``i``."""
        if self.pre is None:
            sample, extra = self.sample(i)
            img, msk, meta = self.codec.read(sample, i)
            return img, msk, {**meta, **extra}
        seg: Any = self.ds  # pre is set only for a dataset with source and indices (see __init__)
        src, j = seg.source, seg.indices[i]
        img, msk = src.load(j)
        out = self.pre(image=img, mask=msk)
        img, msk = np.asarray(out["image"]), np.asarray(out["mask"])
        if img.dtype != np.uint8:  # float sources: the same quantisation the probe applies
            img = (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
        if img.ndim == 2:
            img = img[..., None]
        meta = {"case_id": src.case_id(j), "slice_index": int(src.slice_index(j))}
        return img, msk.astype(np.int64), meta

    def finish(self, image: np.ndarray, mask: np.ndarray, meta: dict[str, Any], augment: bool = True) -> Any:
        """Run the augmentations (unless ``augment=False``) and build the sample: robusttrain's dict,
        or (any other dataset) the loaded sample with ``image`` in place of its image."""
        if "sample" in meta:
            new = self.codec.write(meta["sample"], image)
            if "crops" not in meta:
                return new
            crops = list(meta["crops"])  # the crop list the failing crop came from, that crop replaced
            crops[meta["crop"]] = new
            return crops
        size = image.shape[:2]
        if self.post is not None and augment:
            out = self.post(image=image, mask=mask)
            image, mask = out["image"], out["mask"]
            if image.shape[:2] != size:  # a crop in the augmentations: back to the batch size
                import cv2

                image = cv2.resize(image, size[::-1], interpolation=cv2.INTER_LINEAR)
                mask = cv2.resize(mask.astype(np.uint8), size[::-1], interpolation=cv2.INTER_NEAREST)
            if image.ndim == 2:
                image = image[..., None]
        img = image.astype(np.float32) / 255.0 if image.dtype == np.uint8 else np.clip(image, 0, 1)
        return {
            "image": torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1), dtype=np.float32)),
            "mask": torch.from_numpy(np.ascontiguousarray(mask, dtype=np.int64)),
            "case_id": meta["case_id"],
            "slice_index": meta["slice_index"],
        }


def check_round_trip(view: CleanView, collate: Any = None) -> None:
    """Read item 0 and rebuild its training sample unchanged, then collate it with the original
    using the client's own ``collate`` (default torch's): one clear line when any step fails."""
    from torch.utils.data import default_collate

    collate = collate if collate is not None else default_collate
    try:
        img, msk, meta = view.load(0)
        original = meta.get("crops", meta.get("sample"))
        collate([original, view.finish(img, msk, meta)])
    except HookError:
        raise
    except Exception as err:  # a hook that assumes batch-only structure, a collate mismatch
        raise HookError(
            f"failure replay cannot read or rebuild your training samples ({type(err).__name__}: "
            f"{err}); set MetamorphicCallback(hooks=BatchHooks(...)) to match the sample format "
            "(BatchHooks is importable from robusttrain.callbacks)"
        ) from None


class CleanDataset(Dataset):
    """Index-aligned, un-augmented view of a training dataset: what the train probe should check,
    so that a failure's ``index`` + params re-create exactly the image that failed."""

    def __init__(self, base: SizedDataset):
        self.base, self.view = base, CleanView(base)

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, i: int) -> Any:
        # the probe's reads never move the training augmentations' random streams (shared with this view):
        # a run that checks training cases then trains on exactly the images a run without the check would
        with self.streams_kept():
            if self.view.pre is None:  # not robusttrain's dataset: its own sample (or crop i % k)
                return self.view.sample(i)[0]
            img, msk, meta = self.view.load(i)
            return self.view.finish(img, msk, meta, augment=False)

    @contextlib.contextmanager
    def streams_kept(self) -> Iterator[None]:
        """Read samples without moving the augmentations' random streams (shared with the training
        pipeline: a read before training would otherwise change every augmented batch, and a resume
        would no longer repeat the run)."""
        pre = self.view.pre
        if pre is None:  # MONAI-style transforms keep their own RNGs (and read_seeded keeps them too)
            with rng_kept(self.base):
                yield
            return
        if not hasattr(pre, "random_generator"):
            yield
            return
        state = (pre.random_generator.bit_generator.state, pre.py_random.getstate())
        try:
            yield
        finally:
            pre.random_generator.bit_generator.state = state[0]
            pre.py_random.setstate(state[1])

    def __getattr__(self, name: str) -> Any:
        return _forward(self, name)


def _forward(wrapper: Any, name: str) -> Any:
    # datamodule-specific attributes (case_ids, hard_cases, ...) of the wrapped dataset; never
    # dunders: a forwarded __getitems__ (torch Subset) would bypass the wrapper's __getitem__
    if name.startswith("__") or name in ("base", "view", "codec"):
        raise AttributeError(name)
    return getattr(wrapper.__dict__["base"], name)


class _SlotDataset(Dataset):
    def __init__(self, base: SizedDataset, ratio: float, hooks: BatchHooks | None = None):
        self.base, self.ratio = base, float(ratio)
        self.n_base = len(base)
        self.n_slots = n_slots_for(self.n_base, self.ratio)
        self.view = CleanView(base, hooks)

    def __len__(self) -> int:
        return self.n_base

    def _active(self) -> bool:
        return True

    def set_random_state(self, seed: int | None = None, state: Any = None) -> _SlotDataset:
        """MONAI's DataLoader seeds a dataset's random transforms by walking its attributes
        (``set_rnd``); walked through this wrapper, the base would be reached twice (``base`` and
        ``view.ds``) and seeded differently from the same dataset unwrapped. Seed the base once,
        exactly as MONAI would have."""
        from monai.data.utils import set_rnd

        set_rnd(self.base, seed=0 if seed is None else int(seed))
        return self

    def __getitem__(self, i: int) -> Any:
        if i < 0:
            i += self.n_base
        if not 0 <= i < self.n_base:
            raise IndexError(i)
        # torch's RNG is seeded per worker and per epoch by the DataLoader (and by seed_everything);
        # nothing is drawn while there is nothing to add, so such epochs are the plain ones
        if self.ratio > 0 and self._active() and float(torch.rand(())) < self.ratio:
            rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
            return self._slot(rng)
        return self.base[i]

    def _clean_slot(self, rng: np.random.Generator) -> Any:
        img, msk, meta = self.view.load(int(rng.integers(len(self.view))))
        return self.view.finish(img, msk, meta)

    def __getattr__(self, name: str) -> Any:
        return _forward(self, name)


def jitter_params(
    recorded: dict[str, Any], fresh: dict[str, np.ndarray], alpha: float
) -> dict[str, np.ndarray]:
    """Recorded params in ``fresh``'s dtypes; float ones moved ``alpha`` toward ``fresh``.

    >>> jitter_params({"s": [2.0], "n": [3]}, {"s": np.array([4.0], np.float32), "n": np.array([9])}, 0.5)
    {'s': array([3.], dtype=float32), 'n': array([3])}
    """
    out = {}
    for k, v in recorded.items():
        v = np.asarray(v)
        f = fresh.get(k)
        if f is None:
            out[k] = v
            continue
        f = np.asarray(f)
        v = v.astype(f.dtype) if v.shape == f.shape or v.size == f.size else v
        if alpha > 0 and np.issubdtype(f.dtype, np.floating) and v.shape == f.shape:
            v = ((1 - alpha) * v + alpha * f).astype(f.dtype)
        out[k] = v.reshape(f.shape) if v.size == f.size else v
    return out


class ReplayDataset(_SlotDataset):
    """Mixes mined failures from ``<run_dir>/failures/`` into every epoch (see module doc).

    ``sources`` maps a record's split to the dataset its ``index`` refers to (default
    ``{"train": base}``); validation records are only used with ``allow_val_mining=True`` and a
    matching entry in ``sources``.
    """

    def __init__(
        self,
        base: SizedDataset,
        run_dir: str | os.PathLike | None,
        replay_ratio: float = 0.2,
        jitter: float = 0.1,
        allow_val_mining: bool = False,
        sources: dict[str, SizedDataset] | None = None,
        perturbation_kwargs: dict[str, dict] | None = None,
        clean_mix: float = 0.0,
        fresh_image: float = 0.0,
        hooks: BatchHooks | None = None,
    ):
        super().__init__(base, replay_ratio, hooks)
        for name, v in (("clean_mix", clean_mix), ("fresh_image", fresh_image)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}={v}: expected a probability in [0, 1]")
        if clean_mix + fresh_image > 1.0:
            raise ValueError("clean_mix + fresh_image must be <= 1")
        self.dir = None if run_dir is None else Path(run_dir) / failures_file.DIR
        self.jitter, self.allow_val_mining = float(jitter), allow_val_mining
        self.clean_mix, self.fresh_image = float(clean_mix), float(fresh_image)
        self.views = {"train": self.view}
        for split, ds in (sources or {}).items():
            if split != "train":
                self.views[split] = CleanView(ds, hooks)
        self.perturbation_kwargs = dict(perturbation_kwargs or {})
        self._sig: tuple | None = None
        self._by_pert: dict[str, list[FailureRecord]] = {}
        self._weights: dict[str, float] = {}
        self._ops: dict[tuple[str, int], Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # workers re-read the files themselves; don't ship the parsed bank or built ops
        d = dict(self.__dict__)
        d.update(_sig=None, _by_pert={}, _weights={}, _ops={})
        return d

    def bind(self, run_dir: str | os.PathLike, hooks: BatchHooks | None = None, slice_axis: int = -1) -> None:
        """Read the bank of ``run_dir`` from now on (FailureMiningCallback, before the loader exists);
        ``hooks`` / ``slice_axis``: the MR check's, so samples and volume slices read as it read them."""
        self.dir = Path(run_dir) / failures_file.DIR
        for v in (self.view, *self.views.values()):
            v.codec.slice_axis = int(slice_axis)
            if hooks is not None:
                v.codec.hooks = hooks
        self._sig = None

    def _active(self) -> bool:
        return self.n_trainable > 0

    # ---- reading the shared bank --------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Re-read the bank and sampling weights if their files changed; True when re-read."""
        if self.dir is None:  # not bound to a run yet: nothing to replay
            return False
        sig = (
            failures_file.log_signature(failures_file.log_path(self.dir.parent)),
            failures_file.log_signature(sampling_file.path(self.dir.parent)),
        )
        if sig == self._sig and not force:
            return False
        self._sig = sig
        bank = FailureBank.load(
            self.dir.parent, allow_val_mining=self.allow_val_mining, max_size=10**9
        )  # the writer already applied its bound
        by: dict[str, list[FailureRecord]] = {}
        for r in bank.trainable():
            if r.split in self.views and r.index >= 0:
                by.setdefault(r.perturbation, []).append(r)
        self._by_pert = by
        w = sampling_file.read_weights(self.dir.parent)
        self._weights = {p: float(w.get(p, 0.0)) for p in by}
        if not any(v > 0 for v in self._weights.values()):
            self._weights = {p: 1.0 for p in by}  # no weights yet: uniform over what failed
        return True

    @property
    def n_trainable(self) -> int:
        self.refresh()
        return sum(len(v) for v in self._by_pert.values())

    def weights(self) -> dict[str, float]:
        """Normalised per-perturbation draw probabilities this process uses now."""
        self.refresh()
        tot = sum(self._weights.values())
        return {p: w / tot for p, w in self._weights.items()} if tot > 0 else {}

    # ---- re-creating a failure ----------------------------------------------------------------
    def _op(self, name: str, severity: int) -> Any:
        key = (name, int(severity))
        if key not in self._ops:
            from robusttrain import perturbations as P

            self._ops[key] = P.get(name, severity=int(severity), **self.perturbation_kwargs.get(name, {}))
        return self._ops[key]

    def recreate(
        self, record: FailureRecord, rng: np.random.Generator | None = None, jitter: float | None = None
    ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """(follow-up HWC uint8, unchanged mask, meta) of ``record``; exact with ``jitter=0``."""
        rng = rng if rng is not None else np.random.default_rng()
        jitter = self.jitter if jitter is None else jitter
        view = self.views[record.split]
        img, msk, meta = view.load(record.index)
        op = self._op(record.perturbation, record.severity)
        fresh = sample_params(op, img, msk, rng)  # schema, dtypes, and the jitter target
        alpha = float(rng.uniform(0, jitter)) if jitter > 0 else 0.0
        out = apply_image(op, img, msk, params=jitter_params(record.params, fresh, alpha))
        return out, msk, meta

    def _slot(self, rng: np.random.Generator) -> Any:  # a training sample, in the dataset's format
        self.refresh()
        w = self.weights()
        if not w:
            return self._clean_slot(rng)
        perts = sorted(w)
        pert = perts[rng.choice(len(perts), p=np.array([w[p] for p in perts]))]
        recs = self._by_pert[pert]
        drops = np.array([max(r.drop, 0.05) for r in recs])
        rec = recs[rng.choice(len(recs), p=drops / drops.sum())]
        u = float(rng.uniform()) if (self.clean_mix or self.fresh_image) else 1.0
        if u < self.clean_mix:  # paired clean copy of the failing case
            view = self.views[rec.split]
            return view.finish(*view.load(rec.index))
        if u < self.clean_mix + self.fresh_image:  # the failing family on any training image
            img, msk, meta = self.view.load(int(rng.integers(len(self.view))))
            out = apply_image(self._op(rec.perturbation, rec.severity), img, msk, rng=rng)
            return self.view.finish(out, msk, meta)
        img, msk, meta = self.recreate(rec, rng)
        view = self.views[rec.split]
        return view.finish(img, msk, meta)


class RandomPerturbationDataset(_SlotDataset):
    """Baseline: slots hold a random perturbation x severity with random params (see module doc)."""

    def __init__(
        self,
        base: SizedDataset,
        perturbations: Sequence[str],
        severities: Sequence[int] = (2, 4),
        ratio: float = 0.2,
        perturbation_kwargs: dict[str, dict] | None = None,
        hooks: BatchHooks | None = None,
    ):
        super().__init__(base, ratio, hooks)
        self.tests = [(p, int(s)) for p in perturbations for s in severities]
        self.perturbation_kwargs = dict(perturbation_kwargs or {})
        self._ops: dict[tuple[str, int], Any] = {}

    def _slot(self, rng: np.random.Generator) -> Any:  # a training sample, in the dataset's format
        if not self.tests:
            return self._clean_slot(rng)
        name, sev = self.tests[int(rng.integers(len(self.tests)))]
        if (name, sev) not in self._ops:
            from robusttrain import perturbations as P

            self._ops[(name, sev)] = P.get(name, severity=sev, **self.perturbation_kwargs.get(name, {}))
        img, msk, meta = self.view.load(int(rng.integers(len(self.view))))
        out = apply_image(self._ops[(name, sev)], img, msk, rng=rng)
        return self.view.finish(out, msk, meta)
