"""The fixed, seeded metamorphic test suite: which perturbation x severity, and its params.

Each (case, perturbation, severity) gets a seed from a stable hash of the suite seed and
those three; each slice of the case gets a sub-seed from (case seed, slice index). Params
are sampled once on CPU with a ``torch.Generator`` from that seed and cached, so every
epoch, device, rank and application path (batched torch / per-image numpy) replays the
*same* follow-up images.

>>> import torch
>>> from robusttrain import perturbations as P
>>> suite = MRSuite(["blur"], severities=(2,), seed=0)
>>> suite.prepare(in_channels=3)
>>> img = torch.rand(2, 3, 32, 32)
>>> params = suite.params_for("val", 0, ["c0", "c1"], [0, 0], img)
>>> out = suite.apply(0, img, None, params, path="torch")
>>> out.shape
torch.Size([2, 3, 32, 32])

Volumes (B,C,H,W,D) are perturbed slice-wise along ``slice_axis`` (default the last, D) with
*one* set of params per volume, shared by all its slices: a contrast change, blur or overlay
of a real acquisition affects the whole scan alike, and per-slice draws would add slice-to-slice
flicker no scanner produces. The params are sampled on the volume's slice with the most
foreground (the middle one without a mask), seeded by (case, test), so replay is exact.

>>> vol = torch.rand(1, 1, 16, 16, 6)
>>> s3 = MRSuite(["contrast"], severities=(4,), seed=0); s3.prepare(in_channels=1, probe=vol)
>>> p3 = s3.params_for("val", 0, ["v0"], [0], vol)
>>> s3.apply(0, vol, None, p3).shape
torch.Size([1, 1, 16, 16, 6])
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from robusttrain.errors import InputError
from robusttrain.perturbations.suites import SUITES, resolve

log = logging.getLogger(__name__)

DEFAULT_PERTURBATIONS = SUITES["endoscopy"]  # the nine MedTest endoscopy families
DEFAULT_SEVERITIES = (2, 4)
# Version of the perturbations' param units in cached params: "relative" since spatial params became
# fractions of the image (issue 11). Cached params of another version are re-sampled, never replayed.
PARAM_UNITS = "relative-1"


def stable_seed(*parts: Any) -> int:
    """A 63-bit seed from a stable hash of ``parts`` (unlike ``hash``, same in every process).

    >>> stable_seed(0, "case", "blur", 2) == stable_seed(0, "case", "blur", 2)
    True
    """
    h = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") & (2**63 - 1)


def _to_uint8_hwc(img: torch.Tensor) -> np.ndarray:
    return (img.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()


def to_uint8_list(images: torch.Tensor) -> list[np.ndarray]:
    """(B,C,H,W) float [0,1] -> list of HWC uint8 arrays (the numpy path's input)."""
    u8 = (
        (images.detach().float().clamp(0, 1) * 255).round_().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    )
    return list(u8)


def volume_to_slices(x: torch.Tensor, axis: int = -1, channels: bool = True) -> torch.Tensor:
    """(B,C,H,W,D) -> (B*S, C, ., .): the 2-D slices along spatial ``axis`` (-1 = D), volume-major.

    ``channels=False`` for label volumes (B,H,W,D) -> (B*S, ., .).

    >>> volume_to_slices(torch.zeros(2, 1, 8, 9, 5)).shape, volume_to_slices(torch.zeros(2, 8, 9, 5), 0, False).shape
    (torch.Size([10, 1, 8, 9]), torch.Size([16, 9, 5]))
    """
    x = x.movedim((2 if channels else 1) + axis % 3, 1)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def slices_to_volume(y: torch.Tensor, batch: int, axis: int = -1, channels: bool = True) -> torch.Tensor:
    """Inverse of :func:`volume_to_slices` for a batch of ``batch`` volumes."""
    return y.reshape(batch, -1, *y.shape[1:]).movedim(1, (2 if channels else 1) + axis % 3)


def _from_hwc(arr: np.ndarray) -> torch.Tensor:
    arr = np.asarray(arr)
    if arr.ndim == 2:
        arr = arr[..., None]
    t = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1)
    return t.float() / 255.0 if arr.dtype == np.uint8 else t.float().clamp(0, 1)


class MRSuite:
    """Perturbation families x severities with per-(case, perturbation, severity) cached params.

    ``perturbations``: a suite name (``"endoscopy"``, ``"mri"``, ``"xray"``; see
    :mod:`robusttrain.perturbations.suites`), a list of family and/or suite names, or None for the
    endoscopy suite; an unknown name is a ValueError listing the valid ones.
    ``tests`` is the ordered list of ``(name, severity)``; a test index ``k`` refers to it.
    Families that cannot run on the data (RGB-only on 1-channel images, grey-only on RGB) are
    dropped by :meth:`prepare` and listed in ``skipped``. ``slice_axis``: the spatial axis of
    (B,C,H,W,D) volumes the 2-D perturbations run along (-1 = D, -2 = W, -3 = H; see the module doc).

    >>> MRSuite("mri").names[:2]
    ['bias_field', 'ghosting']
    """

    def __init__(
        self,
        perturbations: str | Sequence[str] | None = None,
        severities: Sequence[int] = DEFAULT_SEVERITIES,
        seed: int = 0,
        perturbation_kwargs: dict[str, dict] | None = None,
        slice_axis: int = -1,
    ):
        from robusttrain.perturbations.base import check_severity

        # validated here, when the suite is built, not after a first training epoch
        if isinstance(slice_axis, bool) or slice_axis not in (-3, -2, -1, 2, 3, 4):
            raise ValueError(
                f"slice_axis must be a spatial axis of (B,C,H,W,D) volumes: -1 (D), -2 (W), "
                f"-3 (H) or 4, 3, 2, got {slice_axis!r}"
            )
        self.slice_axis = int(slice_axis) - 5 if slice_axis > 0 else int(slice_axis)
        self.names = resolve(perturbations) if perturbations is not None else list(DEFAULT_PERTURBATIONS)
        if not self.names or not list(severities):
            raise ValueError("perturbations= and severities= must not be empty")
        self.severities = [check_severity(s, f"severities={list(severities)}") for s in severities]
        self.seed = int(seed)
        self.perturbation_kwargs = dict(perturbation_kwargs or {})
        extra = sorted(set(self.perturbation_kwargs) - set(self.names))
        if extra:
            raise ValueError(
                f"perturbation_kwargs has {extra[0]!r}, which is not in perturbations={self.names}"
            )
        self.tests: list[tuple[str, int]] = []
        self.skipped: dict[str, str] = {}
        self._ops: dict[tuple[str, int], Any] = {}
        self._cache: dict[tuple, dict[str, torch.Tensor]] = {}
        self._packed: tuple[int, dict] | None = None  # (cache size, its packed state): see state_dict
        self.in_channels: int | None = None

    # -- building ---------------------------------------------------------------------
    def prepare(self, in_channels: int, probe: torch.Tensor | None = None) -> None:
        """Instantiate the perturbations for ``in_channels``-channel images (idempotent)."""
        if self.in_channels == in_channels and self.tests:
            return
        from robusttrain import perturbations as P

        if probe is not None and probe.ndim == 5:  # a volume: its 2-D slices are what gets perturbed
            probe = volume_to_slices(probe[:1].float().cpu(), self.slice_axis)[:1]
        self.in_channels, self.tests, self._ops, self.skipped = in_channels, [], {}, {}
        known = set(P.available())
        probe = probe if probe is not None else torch.full((1, in_channels, 64, 64), 0.5)
        for name in self.names:
            if name not in known:
                raise ValueError(f"unknown perturbation '{name}'; available: {sorted(known)}")
            ops = {
                sev: P.get(name, severity=sev, **self.perturbation_kwargs.get(name, {}))
                for sev in self.severities
            }
            reason = next((r for r in (self._cannot_apply(o, probe) for o in ops.values()) if r), "")
            if reason:  # a family runs at every severity or not at all
                self.skipped[name] = reason
                continue
            for sev, op in ops.items():
                self._ops[(name, sev)] = op
                self.tests.append((name, sev))
        if self.skipped:
            hint = (
                ' -- for grey images use the modality\'s suite: MRSuite("mri") or MRSuite("xray")'
                if in_channels == 1
                else ""
            )
            log.warning(
                "metamorphic suite: skipped on %d-channel images: %s%s",
                in_channels,
                "; ".join(f"{k} ({v})" for k, v in self.skipped.items()),
                hint,
            )

    @staticmethod
    def _cannot_apply(op: Any, probe: torch.Tensor) -> str:
        if getattr(op, "requires_rgb", getattr(op, "rgb", False)) and probe.shape[1] != 3:
            return "needs RGB"
        if getattr(op, "grey_only", False) and probe.shape[1] != 1:
            return "needs single-channel (grey) images"
        try:  # the perturbations raise a clear ValueError for data they cannot handle
            g = torch.Generator().manual_seed(0)
            op.apply_batch(probe, None, params=op.sample_params(probe, None, generator=g))
        except ValueError as e:
            return str(e)
        return ""

    def op(self, k: int) -> Any:
        return self._ops[self.tests[k]]

    # -- params -----------------------------------------------------------------------
    def case_seed(self, case_id: str, k: int) -> int:
        name, sev = self.tests[k]
        return stable_seed(self.seed, case_id, name, sev)

    def slice_seed(self, case_id: str, k: int, slice_index: int) -> int:
        return stable_seed(self.case_seed(case_id, k), int(slice_index))

    def params_for(
        self,
        split: str,
        k: int,
        case_ids: Sequence[str],
        slice_indices: Sequence[int],
        images: torch.Tensor,
        masks: torch.Tensor | None = None,
    ) -> list[dict]:
        """Per-sample params (each with leading dim 1, on CPU) for test ``k``; cached."""
        name, sev = self.tests[k]
        out = []
        host: tuple[torch.Tensor, torch.Tensor | None] | None = None
        for i, (cid, si) in enumerate(zip(case_ids, slice_indices)):
            key = (split, cid, name, sev, int(si))
            if key not in self._cache:
                if (
                    host is None
                ):  # the batch read back once (on an accelerator each read waits), not per image
                    host = (images.detach().float().cpu(), None if masks is None else masks.detach().cpu())
                g = torch.Generator().manual_seed(self.slice_seed(cid, k, si))
                img = host[0][i : i + 1]
                m = None if host[1] is None else host[1][i : i + 1]
                if img.ndim == 5:  # one draw per volume, on its representative slice
                    img, m = self._representative_slice(img, m)
                p = self.op(k).sample_params(img, m, generator=g)
                self._cache[key] = {n: v.detach().cpu() for n, v in p.items()}
            out.append(self._cache[key])
        return out

    def _representative_slice(
        self, vol: torch.Tensor, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        slices = volume_to_slices(vol, self.slice_axis)
        j = slices.shape[0] // 2
        if mask is not None:
            mslices = volume_to_slices(mask, self.slice_axis, channels=False)
            fg = (mslices > 0).flatten(1).sum(1)
            j = int(fg.argmax()) if int(fg.max()) > 0 else j
            return slices[j : j + 1], mslices[j : j + 1]
        return slices[j : j + 1], None

    def cached(self, split: str, k: int, case_id: str, slice_index: int) -> dict | None:
        """Cached params of one slice for test ``k`` (None when not sampled yet)."""
        name, sev = self.tests[k]
        return self._cache.get((split, case_id, name, sev, int(slice_index)))

    # -- applying ---------------------------------------------------------------------
    def apply(
        self,
        k: int,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        params: list[dict],
        path: str = "torch",
        uint8: list[np.ndarray] | None = None,
    ) -> torch.Tensor:
        """Follow-up images for test ``k`` on ``path`` ("torch": batched; "numpy": uint8 per image).

        ``uint8``: the batch already converted by :func:`to_uint8_list` (saves one conversion per test;
        for volumes: their slices, as :func:`volume_to_slices` orders them).
        """
        if images.ndim == 5:  # slice-wise, every slice with its volume's params
            n_sl = images.shape[2 + self.slice_axis % 3]
            flat = volume_to_slices(images, self.slice_axis)
            fm = None if masks is None else volume_to_slices(masks, self.slice_axis, channels=False)
            out = self.apply(k, flat, fm, [p for p in params for _ in range(n_sl)], path, uint8)
            return slices_to_volume(out, images.shape[0], self.slice_axis)
        op = self.op(k)
        if path == "numpy":
            src = uint8 if uint8 is not None else to_uint8_list(images)
            mk = None if masks is None else masks.cpu().numpy()
            outs = [
                op.apply_numpy(
                    src[i], mask=None if mk is None else mk[i], params={n: v[0].numpy() for n, v in p.items()}
                )[0]
                for i, p in enumerate(params)
            ]
            if all(o.dtype == np.uint8 and o.shape == outs[0].shape for o in outs):
                arr = np.stack(outs)
                arr = arr[..., None] if arr.ndim == 3 else arr
                t = torch.from_numpy(arr).permute(0, 3, 1, 2).float().div_(255.0)
            else:
                t = torch.stack([_from_hwc(o) for o in outs])
            return t.to(images.device, images.dtype)
        if path != "torch":
            raise ValueError(f"path must be 'torch' or 'numpy', got {path!r}")
        try:
            batched = {n: torch.cat([p[n] for p in params]).to(images.device) for n in params[0]}
        except RuntimeError:  # per-sample params of different shapes: apply one by one
            return torch.cat(
                [
                    self.apply(k, images[i : i + 1], None if masks is None else masks[i : i + 1], [p], path)
                    for i, p in enumerate(params)
                ]
            )
        out, _ = op.apply_batch(images, masks, params=batched)
        return out.to(images.dtype)

    def apply_family(
        self,
        ks: Sequence[int],
        images: Sequence[torch.Tensor],
        masks: Sequence[torch.Tensor | None],
        params: Sequence[list[dict]],
    ) -> list[torch.Tensor]:
        """Follow-up images of tests ``ks`` of ONE family (torch path, (B,C,H,W) images): the batches of all
        its severities in one ``apply_family`` call (one call per family, not per test), the same images as
        :meth:`apply` per test. ``images[i]``, ``masks[i]``, ``params[i]``: test ``ks[i]``'s rows."""
        names = {self.tests[k][0] for k in ks}
        if len(names) != 1:
            raise ValueError(f"apply_family: tests {list(ks)} are not of one family ({sorted(names)})")
        sizes = [x.shape[0] for x in images]
        x = torch.cat(list(images))
        given = [mm for mm in masks if mm is not None]
        m = torch.cat([mm.to(x.device) for mm in given]) if len(given) == len(masks) else None
        sev = torch.tensor([self.tests[k][1] for k, n in zip(ks, sizes) for _ in range(n)])
        groups, start = [], 0
        for n, ps in zip(sizes, params):
            try:
                batched = {key: torch.cat([p[key] for p in ps]).to(x.device) for key in ps[0]}
            except RuntimeError:  # per-sample params of different shapes: apply test by test
                return [self.apply(k, xi, mi, pi) for k, xi, mi, pi in zip(ks, images, masks, params)]
            groups.append((torch.arange(start, start + n), batched))
            start += n
        out, _ = self.op(ks[0]).apply_family(x, m, sev, params=groups)
        return list(out.to(x.dtype).split(sizes))

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "names": self.names,
            "severities": self.severities,
            "seed": self.seed,
            "param_units": PARAM_UNITS,
            "slice_axis": self.slice_axis,
            "cache": self._packed_cache(),
        }

    def _packed_cache(self) -> dict:
        """The params cache as a few stacked tensors (see :func:`pack_cache`), re-packed only when it
        grew: entries are only ever added, and every checkpoint of a run (candidates, ``last.ckpt``, top-k)
        saves it again -- as one tiny tensor per param it cost ~0.1 s of pickling per checkpoint."""
        if self._packed is None or self._packed[0] != len(self._cache):
            self._packed = (len(self._cache), pack_cache(self._cache))
        return self._packed[1]

    def describe(self) -> str:
        """One line naming the suite (recorded with every checkpoint; compared on resume)."""
        return f"perturbations={self.names} severities={self.severities} seed={self.seed}"

    def check_state(self, state: dict) -> None:
        """Raise :class:`InputError` when a checkpoint's suite ``state`` differs from this suite."""
        if (
            state.get("seed", self.seed) != self.seed
            or list(state.get("names", self.names)) != self.names
            or [int(s) for s in state.get("severities", self.severities)] != self.severities
            or state.get("slice_axis", self.slice_axis) != self.slice_axis
        ):
            raise InputError(
                "cannot resume: the checkpoint's metamorphic suite (perturbations="
                f"{list(state.get('names', []))} severities={list(state.get('severities', []))} seed="
                f"{state.get('seed')}) differs from the configured one ({self.describe()}); its EFR and "
                "history would not be comparable -- resume with the same suite or start a new run_dir"
            )

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        if state.get("cache") and state.get("param_units") != PARAM_UNITS:
            log.warning(
                "metamorphic suite: checkpoint holds params in older (pixel) units; "
                "params will be re-sampled in relative units"
            )
            return
        self._cache = unpack_cache(state.get("cache", []))
        self._packed = None


def pack_cache(cache: dict[tuple, dict[str, torch.Tensor]]) -> dict:
    """The params cache as ``{"groups": [{"keys": [...], "params": {name: stacked tensor}}]}``: entries
    with the same param names, shapes and dtypes share one tensor per param (a checkpoint stores each
    tensor as its own record, so one per entry and param made every save slow). Plain lists and tensors,
    so ``torch.load(weights_only=True)`` reads it; :func:`unpack_cache` gives the same cache back.

    >>> c = {("val", "a", "blur", 2, 0): {"sigma": torch.tensor([1.5])},
    ...      ("val", "b", "blur", 2, 0): {"sigma": torch.tensor([2.5])}}
    >>> packed = pack_cache(c); len(packed["groups"]), packed["groups"][0]["params"]["sigma"].shape
    (1, torch.Size([2, 1]))
    >>> back = unpack_cache(packed); list(back) == list(c), back[("val", "b", "blur", 2, 0)]["sigma"]
    (True, tensor([2.5000]))
    """
    groups: dict[tuple, dict[str, Any]] = {}
    order: list[tuple[int, int]] = []  # (group, row) of every entry, in cache (insertion) order
    for key, params in cache.items():
        sig = tuple((n, tuple(v.shape), str(v.dtype)) for n, v in params.items())
        g = groups.setdefault(sig, {"index": len(groups), "keys": [], "values": []})
        order.append((g["index"], len(g["keys"])))
        g["keys"].append(list(key))
        g["values"].append(params)
    out = []
    for sig, g in groups.items():
        stacked = {n: torch.stack([p[n] for p in g["values"]]) for n, _, _ in sig}
        out.append({"keys": g["keys"], "params": stacked})
    return {"groups": out, "order": torch.tensor(order, dtype=torch.int64).reshape(-1, 2)}


def unpack_cache(state: Any) -> dict[tuple, dict[str, torch.Tensor]]:
    """The cache :func:`pack_cache` packed (or the older ``[[key, params], ...]`` list), in its order."""
    if isinstance(state, dict):
        groups = state.get("groups", [])
        entries = [
            (tuple(k), {n: v[i].clone() for n, v in g["params"].items()})
            for g in groups
            for i, k in enumerate(g["keys"])
        ]
        if "order" not in state:
            return dict(entries)
        starts = np.cumsum([0] + [len(g["keys"]) for g in groups])
        return dict(entries[int(starts[gi]) + int(row)] for gi, row in state["order"].tolist())
    return {tuple(k): v for k, v in state or []}
