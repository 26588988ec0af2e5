"""MONAI-style training samples: random transforms with their own RNGs, and lists of crops.

MONAI's random transforms draw from their own ``R`` (a ``np.random.RandomState``), not from the
global streams that the metamorphic check saves and restores. Two consequences for failure mining:

* reading a training sample outside training (the train probe, a replay) must not move those
  streams, or training changes; :func:`rng_kept` saves and restores every ``R`` reachable from the
  dataset (through its attributes and lists, as MONAI's ``set_rnd`` walks them);
* a sample may be a *list of crops* (``RandCropByPosNegLabeld(num_samples=k)`` returns k dicts
  per volume, ``list_data_collate`` flattens them). :func:`read_seeded` reads sample ``i`` with
  every random transform seeded from ``i`` (under :func:`rng_kept`), so crop ``j`` of sample ``i``
  is the same crop each time it is read: the train probe checks every crop (index ``i * k + j``)
  and replay re-creates the failing one.

>>> import numpy as np
>>> class Crop:                                  # a stand-in for a MONAI random transform
...     def __init__(self): self.R = np.random.RandomState(0)
...     def set_random_state(self, seed=None, state=None): self.R = np.random.RandomState(seed); return self
>>> class Data:
...     def __init__(self): self.transform = Crop()
...     def __len__(self): return 3
...     def __getitem__(self, i): return [{"start": int(self.transform.R.randint(100))} for _ in range(2)]
>>> ds = Data(); before = ds.transform.R.get_state()[1][:3].tolist()
>>> read_seeded(ds, 1) == read_seeded(ds, 1), ds.transform.R.get_state()[1][:3].tolist() == before
(True, True)
>>> is_crop_list(ds[0]), is_crop_list(({"a": 1}, 2))
(True, False)
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any, TypeGuard

import numpy as np
import torch

_SKIP = (str, bytes, int, float, bool, type(None), np.ndarray, torch.Tensor)


def is_crop_list(sample: Any) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    """A list/tuple of dict samples (MONAI's ``num_samples=k`` crops), not an ``(image, mask)`` pair."""
    return isinstance(sample, (list, tuple)) and len(sample) > 0 and all(isinstance(s, dict) for s in sample)


def random_states(obj: Any) -> list[tuple[Any, np.random.RandomState]]:
    """Every ``(owner, owner.R)`` reachable from ``obj`` through attributes, lists and tuples."""
    found, seen, stack = [], set(), [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, _SKIP) or id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, (list, tuple)):
            stack.extend(o)
            continue
        d = getattr(o, "__dict__", None)
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("R"), np.random.RandomState):
            found.append((o, d["R"]))
        stack.extend(v for k, v in d.items() if not k.startswith("__"))
    return found


@contextlib.contextmanager
def rng_kept(obj: Any) -> Iterator[None]:
    """Whatever happens inside, every random transform reachable from ``obj`` ends with the same
    ``R`` object in the same state (``set_random_state`` replaces ``R``: both are put back), and
    the global torch / numpy / python streams are as before."""
    saved = [(o, r, r.get_state()) for o, r in random_states(obj)]
    glob = (torch.get_rng_state(), np.random.get_state(), random.getstate())  # non-MONAI transforms
    try:
        yield
    finally:
        torch.set_rng_state(glob[0])
        np.random.set_state(glob[1])
        random.setstate(glob[2])
        for o, r, st in saved:
            r.set_state(st)
            o.R = r


def read_seeded(dataset: Any, i: int) -> Any:
    """``dataset[i]`` with its random transforms seeded from ``i`` (MONAI's ``set_rnd``; without
    MONAI, each ``R`` seeded in walk order), streams kept: the same sample every time."""
    with rng_kept(dataset):
        try:
            from monai.data.utils import set_rnd

            set_rnd(dataset, seed=1_000_003 * (int(i) + 1))
        except ImportError:  # pragma: no cover - MONAI is a dependency
            for k, (o, _) in enumerate(random_states(dataset)):
                o.R = np.random.RandomState((1_000_003 * (int(i) + 1) + k) % 2**32)
        return dataset[i]
