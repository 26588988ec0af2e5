"""Replay in the client's own sample format, on any map-style dataset (issue 13): tuples, float masks
with a channel dim, masks under another key, torch Subset (random_split), and no change at all while
the bank is empty."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, random_split

from robusttrain.metamorphic.batch import BatchHooks, HookError
from robusttrain.metamorphic.records import FailureRecord
from robusttrain.mining.bank import FailureBank
from robusttrain.mining.replay import ReplayDataset


class Pairs(Dataset):
    """``(image (3,H,W), mask (1,H,W) float)`` tuples: a bright square on a dark background."""

    def __init__(self, n=10, size=24):
        g = torch.Generator().manual_seed(0)
        self.x = 0.1 + 0.1 * torch.rand(n, 3, size, size, generator=g)
        self.m = torch.zeros(n, 1, size, size)
        for i in range(n):
            self.x[i, :, 4:12, 4 + i % 6 : 12 + i % 6] = 0.9
            self.m[i, 0, 4:12, 4 + i % 6 : 12 + i % 6] = 0.97  # soft labels: round to 1, never truncate to 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.m[i]


class Labelled(Pairs):
    """Dict samples whose masks live under ``label`` (and images under ``img``)."""

    def __getitem__(self, i):
        return {"img": self.x[i], "label": self.m[i, 0].long(), "name": f"case{i}"}


def _contrast_params(ds, run):
    # a real record needs params in the perturbation's schema: sample them from the clean image
    from robusttrain import perturbations as P

    op = P.get("contrast", severity=4)
    img, msk, _ = ds.view.load(2)
    fresh = op.sample_numpy(img, msk, rng=np.random.default_rng(0))
    bank = FailureBank(run)
    bank.add(
        FailureRecord(
            case_id="idx2",
            split="train",
            perturbation="contrast",
            severity=4,
            params={k: np.asarray(v).tolist() for k, v in fresh.items()},
            seed=0,
            epoch=0,
            src_dice=0.9,
            fol_dice=0.1,
            src_iou=0.8,
            fol_iou=0.1,
            index=2,
        )
    )
    bank.flush(0)


def test_empty_bank_returns_the_original_samples_and_draws_nothing(tmp_path):
    base = Pairs()
    ds = ReplayDataset(base, tmp_path, replay_ratio=0.5)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    for i in range(len(base)):
        assert ds[i][0] is base.x[i] or torch.equal(ds[i][0], base.x[i])
    assert torch.equal(torch.get_rng_state(), before)  # training RNG untouched: epochs identical to no replay
    assert len(ds) == len(base)


def test_tuple_samples_with_float_channel_masks_keep_their_format(tmp_path):
    base = Pairs()
    ds = ReplayDataset(base, tmp_path, replay_ratio=0.5)
    _contrast_params(ds, tmp_path)
    s = ds._slot(np.random.default_rng(0))
    assert isinstance(s, tuple) and len(s) == 2
    assert s[0].shape == (3, 24, 24) and s[0].dtype == torch.float32 and not torch.equal(s[0], base.x[2])
    assert torch.equal(s[1], base.m[2])  # the client's own mask: float, (1,H,W), 0.97 kept
    _, mask, _ = ds.view.load(2)
    assert mask.max() == 1  # what the perturbation sees: rounded like the MR check, not truncated
    batch = next(iter(DataLoader(ds, batch_size=10)))  # collates with the originals
    assert batch[0].shape == (10, 3, 24, 24) and batch[1].shape == (10, 1, 24, 24)


def test_masks_under_another_key_through_hooks(tmp_path):
    hooks = BatchHooks(
        get_images=lambda b: b["img"], get_masks=lambda b: b["label"], get_case_ids=lambda b: b["name"]
    )
    base = Labelled()
    ds = ReplayDataset(base, None, replay_ratio=0.5)
    with pytest.raises(HookError, match="get_images"):
        ds.view.codec.check(base)  # default hooks cannot read it: one line naming the hook
    ds.bind(tmp_path, hooks)
    ds.view.codec.check(base)
    _contrast_params(ds, tmp_path)
    s = ds._slot(np.random.default_rng(0))
    assert set(s) == {"img", "label", "name"} and s["name"] == "case2" and s["label"].dtype == torch.int64


def test_subset_from_random_split_is_replayed_not_bypassed(tmp_path):
    train, _ = random_split(Pairs(12), [8, 4], generator=torch.Generator().manual_seed(0))
    assert hasattr(train, "__getitems__")  # torch's Subset batches fetches through it
    ds = ReplayDataset(train, tmp_path, replay_ratio=0.8)
    assert not hasattr(ds, "__getitems__")  # so the DataLoader calls our __getitem__ per index
    _contrast_params(ds, tmp_path)
    torch.manual_seed(0)
    batch = next(iter(DataLoader(ds, batch_size=8)))
    originals = torch.stack([train[i][0] for i in range(8)])
    replaced = (batch[0] - originals).abs().flatten(1).amax(1) > 1e-6
    assert int(replaced.sum()) == ds.n_slots == round(0.8 * 8)  # the epoch's slots, each a replayed sample


def test_volumes_round_trip_and_other_shapes_are_refused_by_name(tmp_path):
    class Vol(Dataset):
        def __init__(self, shape):
            self.shape = shape

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.rand(*self.shape), torch.zeros(*self.shape[1:])

    vol = Vol((1, 8, 8, 4))
    ds = ReplayDataset(vol, tmp_path)
    ds.view.codec.check(vol)  # a (C,H,W,D) volume reads as its slices and is written back unchanged
    img, msk, _ = ds.view.codec.read(vol[0], 0)
    assert img.shape == (4, 8, 8, 1) and msk.shape == (4, 8, 8)
    flat = Vol((8, 8))  # (H,W) images without a channel dim collate to (B,H,W)
    with pytest.raises(HookError, match=r"\(C,H,W\) images or \(C,H,W,D\) volumes.*\(1, 8, 8\)"):
        ReplayDataset(flat, tmp_path).view.codec.check(flat)


def test_maskless_samples_are_refused_naming_the_hook(tmp_path):
    class ImagesOnly(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"image": torch.rand(3, 8, 8)}

    ds = ReplayDataset(ImagesOnly(), tmp_path)
    with pytest.raises(HookError, match=r"cannot find masks.*get_masks="):
        ds.view.codec.check(ImagesOnly())
