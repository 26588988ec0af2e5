"""Reading one training sample through the batch hooks, and putting a replayed image back into it.

Replay must hand the training loop samples in the client's *own* format (dict with any keys,
``(image, mask)`` tuples, numpy or torch, float or integer masks with or without a channel
dimension). :class:`SampleCodec` reads a sample by collating it alone and applying the same
:class:`~robusttrain.metamorphic.batch.BatchHooks` the metamorphic check uses (so masks are
rounded the same way), and writes a new image into a *copy* of the sample, in the place and dtype
the image had: the mask and every other field stay the client's own (perturbations never change
masks).

>>> import torch
>>> codec = SampleCodec()
>>> sample = (torch.rand(1, 8, 8), torch.full((1, 8, 8), 0.97))    # float mask with a channel dim
>>> img, mask, meta = codec.read(sample, 3)
>>> img.shape, mask.dtype.name, int(mask.max()), meta["case_id"]
((8, 8, 1), 'int64', 1, 'idx3')
>>> out = codec.write(sample, img)
>>> type(out).__name__, out[0].shape, out[1] is sample[1]
('tuple', torch.Size([1, 8, 8]), True)

A volume sample ((C,H,W,D) image) reads as the stack of its 2-D slices along ``slice_axis`` (the MR
suite's): image (S,H,W,C) uint8, mask (S,H,W) -- the replay perturbs it slice-wise, as the check did.

>>> vol = {"image": torch.rand(1, 8, 8, 5), "mask": torch.zeros(8, 8, 5, dtype=torch.long)}
>>> img, mask, _ = codec.read(vol, 0)
>>> img.shape, mask.shape, codec.write(vol, img)["image"].shape
((5, 8, 8, 1), (5, 8, 8), torch.Size([1, 8, 8, 5]))
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from robusttrain.metamorphic.batch import BatchHooks, HookError, case_id_list, normalise_mask
from robusttrain.metamorphic.suite import slices_to_volume, volume_to_slices


class SampleCodec:
    """Read (image HWC uint8, mask HW int64, meta) from a sample; write an image back into it.

    Volumes: (S,H,W,C) / (S,H,W), their slices along ``slice_axis`` (see the module doc)."""

    def __init__(self, hooks: BatchHooks | None = None, id_prefix: str = "idx", slice_axis: int = -1):
        self.hooks = hooks if hooks is not None else BatchHooks()
        self.id_prefix, self.slice_axis = id_prefix, int(slice_axis)

    def read(self, sample: Any, index: int) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        batch = default_collate([sample])
        images = self.hooks.get_images(batch)
        if not torch.is_tensor(images) or images.ndim not in (4, 5):
            shape = tuple(getattr(images, "shape", ()))
            raise HookError(
                f"failure replay needs (C,H,W) images or (C,H,W,D) volumes; got batches of shape "
                f"{shape} -- set get_images= or replay_ratio=0"
            )
        masks = normalise_mask(self.hooks.get_masks(batch), images)
        cids = self.hooks.get_case_ids(batch)
        cids = case_id_list(cids) if cids is not None else []  # a custom hook may return a tensor
        sl = self.hooks.get_slice_indices(batch)
        meta = {
            "case_id": cids[0] if cids else f"{self.id_prefix}{index}",
            "slice_index": int(sl[0]) if sl else 0,
        }
        img = (images[:1].detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
        if img.ndim == 5:  # a volume: its slices along the suite's axis
            slices = volume_to_slices(img, self.slice_axis).permute(0, 2, 3, 1)
            msk = volume_to_slices(masks[:1], self.slice_axis, channels=False)
            return slices.numpy(), msk.numpy().astype(np.int64), meta
        return img[0].permute(1, 2, 0).numpy(), masks[0].numpy().astype(np.int64), meta

    def write(self, sample: Any, image: np.ndarray) -> Any:
        """A copy of ``sample`` whose image is ``image`` (HWC uint8), in the original's type and dtype."""
        leaf = self.hooks.get_images(sample)
        if image.ndim == 4:  # slices (S,H,W,C) -> the volume (C,H,W,D) they came from
            vol = slices_to_volume(
                torch.from_numpy(np.ascontiguousarray(image)).permute(0, 3, 1, 2), 1, self.slice_axis
            )[0]
            image = vol.movedim(0, -1).numpy()  # channels last, as _like expects
        new = _like(leaf, image)
        out, found = _replace_leaf(sample, leaf, new)
        if not found:
            raise HookError(
                "cannot put a replayed image back into the training sample: get_images= "
                "must return the sample's own image tensor (e.g. lambda b: b['img'])"
            )
        return out

    def check(self, dataset: Any, collate: Any = None) -> None:
        """Read sample 0 and write it back unchanged, collate both with ``collate`` (the client's;
        default torch's); raise one clear line when any step fails."""
        sample = dataset[0]
        try:
            img, _, _ = self.read(sample, 0)
            again = self.write(sample, img)
            (collate or default_collate)([sample, again])
        except HookError:
            raise
        except Exception as err:  # a hook that assumes batch-only structure, a collate mismatch
            raise HookError(
                f"failure replay cannot read or rebuild your training samples ({type(err).__name__}: "
                f"{err}); set hooks= on MetamorphicCallback to match the sample format"
            ) from None


def _like(leaf: Any, image: np.ndarray) -> Any:
    """``image`` (HW[D]C uint8) as ``leaf``'s kind: (C,H,W[,D]) tensor/array, same dtype, [0,1] for floats."""
    chw = np.ascontiguousarray(np.moveaxis(image, -1, 0))
    shape = tuple(leaf.shape)
    if len(shape) == 2 and chw.shape[0] == 1:  # (H,W) grey images
        chw = chw[0]
    if torch.is_tensor(leaf):
        t = torch.from_numpy(chw)
        t = (t.to(leaf.dtype) if leaf.dtype == torch.uint8 else t.to(leaf.dtype) / 255.0).reshape(shape)
        if type(leaf) is not torch.Tensor:  # MONAI's MetaTensor (a subclass): its type and metadata,
            with torch.no_grad():  # which the client's collate (list_data_collate) reads
                out = leaf.detach().clone()
                out.copy_(t)
            return out
        return t
    arr = np.asarray(leaf)
    new = chw.astype(arr.dtype) if arr.dtype == np.uint8 else (chw / 255.0).astype(arr.dtype)
    return new.reshape(shape)


def _replace_leaf(obj: Any, leaf: Any, new: Any) -> tuple[Any, bool]:
    if obj is leaf:
        return new, True
    if isinstance(obj, dict):
        for k, v in obj.items():
            rep, found = _replace_leaf(v, leaf, new)
            if found:
                return {**obj, k: rep}, True
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            rep, found = _replace_leaf(v, leaf, new)
            if found:
                items = list(obj)
                items[i] = rep
                if isinstance(obj, list):
                    return items, True
                return (type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)), True
    return obj, False
