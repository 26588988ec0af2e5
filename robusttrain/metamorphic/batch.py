"""Reading probe batches: default hooks for dict / tuple batches, and an indexed loader.

The probe iterates a *dataset* (not a trainer's loader), so every sample's dataset index
is known; a case without ``case_id`` is named ``idx<dataset index>``.

>>> import torch
>>> ds = [(torch.rand(3, 8, 8), torch.zeros(8, 8, dtype=torch.long)) for _ in range(3)]
>>> hooks = BatchHooks()
>>> [pb.case_ids for pb in iter_probe(ds, [2, 0], batch_size=2, hooks=hooks)]
[['idx2', 'idx0']]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from robusttrain.errors import InputError


class HookError(InputError):
    """A batch could not be read by the default hooks; the message names the hook to set."""


MASK_KEYS = ("mask", "label")  # robusttrain's, then MONAI's convention
WHERE = (
    "pass MetamorphicCallback(hooks=BatchHooks({hook}=...)) (BatchHooks is importable from "
    "robusttrain.callbacks; the other robustness callbacks use the same hooks)"
)


def _found(batch: Any) -> str:
    if isinstance(batch, dict):
        return f"a dict with keys {sorted(map(str, batch))}"
    if isinstance(batch, (list, tuple)):
        return f"a {type(batch).__name__} of {len(batch)} ({', '.join(type(b).__name__ for b in batch[:4])})"
    return type(batch).__name__


def default_get_images(batch: Any) -> torch.Tensor:
    if isinstance(batch, dict) and "image" in batch:
        return batch["image"]
    if isinstance(batch, (list, tuple)) and len(batch) >= 2 and torch.is_tensor(batch[0]):
        return batch[0]
    raise HookError(
        "cannot find images in the batch (expected a dict with 'image' or an (image, mask) "
        f"tuple, got {_found(batch)}); " + WHERE.format(hook="get_images")
    )


def default_get_masks(batch: Any) -> torch.Tensor:
    if isinstance(batch, dict) and any(k in batch for k in MASK_KEYS):
        m = batch[next(k for k in MASK_KEYS if k in batch)]
    elif isinstance(batch, (list, tuple)) and len(batch) >= 2 and torch.is_tensor(batch[1]):
        m = batch[1]
    else:
        raise HookError(
            f"cannot find masks in the batch (expected a dict with one of {list(MASK_KEYS)} or an "
            f"(image, mask) tuple, got {_found(batch)}); " + WHERE.format(hook="get_masks")
        )
    return m


def case_id_list(ids: Any) -> list[str]:
    """Case ids as plain strings, whatever the collate made of them.

    ``default_collate`` turns integer ids into a tensor; ``str`` of its elements would give
    ``"tensor(1000)"``, so tensors and numpy arrays become ``str(int)`` per element.

    >>> import torch, numpy as np
    >>> case_id_list(torch.tensor([1000, 7])), case_id_list(["a", np.int64(3), torch.tensor(5)])
    (['1000', '7'], ['a', '3', '5'])
    """
    if torch.is_tensor(ids) or isinstance(ids, np.ndarray):
        ids = ids.reshape(-1).tolist()
    elif isinstance(ids, (str, bytes)):
        ids = [ids]
    return [_case_id(c) for c in ids]


def _case_id(c: Any) -> str:
    if torch.is_tensor(c) and c.numel() == 1 or isinstance(c, np.ndarray) and c.size == 1:
        c = c.item()
    if isinstance(c, np.generic):
        c = c.item()
    if isinstance(c, bytes):
        c = c.decode()
    if isinstance(c, float) and c.is_integer():
        c = int(c)  # a float-collated integer id: 3.0 is case "3"
    return str(c)


def default_get_case_ids(batch: Any) -> Sequence[str] | None:
    if isinstance(batch, dict) and "case_id" in batch:
        return case_id_list(batch["case_id"])
    return None


def default_get_slice_indices(batch: Any) -> Sequence[int] | None:
    if isinstance(batch, dict) and "slice_index" in batch:
        return [int(s) for s in torch.as_tensor(batch["slice_index"]).reshape(-1)]
    return None


def normalise_mask(m: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """Masks as (B,H,W) / (B,H,W,D) label maps matching ``images`` (a (B,1,...) channel dim dropped);
    :class:`HookError` naming the hook to set otherwise."""
    if not torch.is_tensor(m):
        raise HookError(f"masks must be a tensor, got {type(m).__name__}; pass get_masks=")
    if m.ndim == images.ndim and m.shape[1] == 1:  # (B,1,H,W[,D]) binary masks are common
        m = m[:, 0]
    want = "(B,H,W,D)" if images.ndim == 5 else "(B,H,W)"
    if m.shape == images.shape and images.ndim == 4:  # e.g. (B,H,W,D) volumes read without a channel dim
        raise HookError(
            f"images {tuple(images.shape)} have the masks' shape: images need a channel dim, "
            "(B,C,H,W) or (B,C,H,W,D); pass get_images="
        )
    if m.ndim != images.ndim - 1 or m.shape[0] != images.shape[0] or m.shape[1:] != images.shape[2:]:
        raise HookError(
            f"masks must be {want} class indices matching images {tuple(images.shape)}, "
            f"got {tuple(m.shape)}; pass get_masks="
        )
    return m.round().long() if m.is_floating_point() else m.long()


@dataclass
class BatchHooks:
    """How to read a collated batch; each hook can be replaced by the user.

    ``to_probabilities(outputs) -> (B,K,H,W)`` turns the model's outputs into probabilities
    (None: logits -> sigmoid for one channel, softmax for K).
    """

    get_images: Callable[[Any], torch.Tensor] = default_get_images
    get_masks: Callable[[Any], torch.Tensor] = default_get_masks
    get_case_ids: Callable[[Any], Sequence[str] | None] = default_get_case_ids
    get_slice_indices: Callable[[Any], Sequence[int] | None] = default_get_slice_indices
    to_probabilities: Callable[[Any], torch.Tensor] | None = None


@dataclass
class ProbeBatch:
    indices: list[int]
    images: torch.Tensor  # (B,C,H,W) float, or (B,C,H,W,D) volumes
    masks: torch.Tensor  # (B,H,W) int64, or (B,H,W,D)
    case_ids: list[str]
    slice_indices: list[int]


class SizedDataset(Protocol):
    """A map-style dataset with a length (``len(ds)``, ``ds[i]``): what the probes and failure replay
    read. torch's ``Dataset`` declares no ``__len__``; a map-style dataset defines one.

    >>> def size(ds: SizedDataset) -> int: return len(ds)
    >>> size([{"image": 0}, {"image": 1}])
    2
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class _Indexed(Dataset):
    def __init__(self, ds: Dataset, indices: Sequence[int]):
        self.ds, self.indices = ds, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.indices[i], self.ds[self.indices[i]]


def _collate(items):
    return [i for i, _ in items], default_collate([x for _, x in items])


def read_batch(indices: list[int], batch: Any, hooks: BatchHooks, id_prefix: str = "idx") -> ProbeBatch:
    """Apply the hooks to one collated batch and check what they return.

    Samples without a case id are named ``<id_prefix><dataset index>``."""
    images = hooks.get_images(batch)
    if not torch.is_tensor(images) or images.ndim not in (4, 5):
        shape = tuple(images.shape) if torch.is_tensor(images) else type(images).__name__
        raise HookError(
            f"images must be (B,C,H,W) images or (B,C,H,W,D) volumes, got {shape}; "
            "pass get_images= returning one of those"
        )
    masks = normalise_mask(hooks.get_masks(batch), images)
    cids = hooks.get_case_ids(batch)
    cids = [f"{id_prefix}{i}" for i in indices] if cids is None else case_id_list(cids)
    sl = hooks.get_slice_indices(batch)
    sl = [0] * len(indices) if sl is None else [int(s) for s in sl]
    if len(cids) != len(indices) or len(sl) != len(indices):
        raise HookError(
            "get_case_ids / get_slice_indices returned a list whose length differs "
            "from the batch size; fix get_case_ids="
        )
    images = images.float()
    check_finite_images(images, cids)
    return ProbeBatch(indices, images, masks, cids, sl)


def check_finite_images(images: torch.Tensor, case_ids: Sequence[str]) -> None:
    """ValueError naming the cases whose images hold NaN/inf (they would pass every perturbation)."""
    finite = torch.isfinite(images).flatten(1).all(1)
    if not bool(finite.all()):
        bad = [case_ids[i] for i in (~finite).nonzero().flatten().tolist()]
        raise InputError(
            f"probe images of case(s) {bad} contain NaN or inf; expected finite values "
            f"in [0,1] (check the dataset / transforms)"
        )


def iter_probe(
    dataset: Dataset,
    indices: Sequence[int],
    batch_size: int,
    hooks: BatchHooks,
    num_workers: int = 0,
    id_prefix: str = "idx",
) -> Iterator[ProbeBatch]:
    """Batches of ``dataset[indices]`` in the given order, read through ``hooks``."""
    loader = DataLoader(
        _Indexed(dataset, indices),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=_collate,
    )
    for idx, batch in loader:
        yield read_batch(idx, batch, hooks, id_prefix)


def case_ids_of(dataset: SizedDataset) -> list[str] | None:
    """Per-index case ids when the dataset can tell them cheaply (``case_ids()``), else None."""
    fn = getattr(dataset, "case_ids", None)
    if callable(fn):
        try:
            ids = case_id_list(fn())
        except Exception:  # a dataset-specific failure must not break the probe
            return None
        if len(ids) == len(dataset):
            return ids
    return None
