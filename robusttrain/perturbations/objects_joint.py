"""Feces and blood rows of one draw placed in one pass (WorstOfK draws them in one call per family, then
renders every pasted object together: this makes their placement one pass too).

A family's sampler consumes the generator as one 32-bit word per value, in a fixed order (object size,
the Gumbel uniforms of the cell pick, the jitter, the cut-out, the angle, the flip). So at the family's turn
in the draw one uniform draw of that length takes exactly the words the sampler would take (the stream of
the families after it is unchanged), and the placement runs later on all rows at once: a float uniform is
``(word & 0xFFFFFF) / 2**24`` and ``randint(0, n)`` is ``word % n``, so for a bank of ``n = 2**j`` cut-outs
the integer draws are ``(u * 2**24) & (n - 1)``, exact. Per-row tables carry each row's family and severity
(size range, erosion margin, bank offset for the luma reference). The params are those of
``PastedObject._place`` on each family's rows alone, bit for bit (``draw`` declines where it cannot promise it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .base import Params, f32, short_side
from .border import cell_size
from .placement import cell_index_yx, erode_cells_rows, maps_torch, pick_cells_from

_WORD = float(2**24)  # a float32 uniform times this is the low 24 bits of its generator word (exact)
_EXTRA = 6  # values per row besides the Gumbel uniforms: size, jitter (2), cut-out, angle, flip


def _cells(h: int, w: int) -> int:
    k = cell_size(h, w)
    return (h // k) * (w // k)


def draw(op: Any, images: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor | None:
    """The words ``op``'s sampler would take for the rows of ``images`` (one uniform draw), or None when its
    integer draws cannot be read from them (a bank whose size is not a power of two)."""
    n = len(op.bank)
    b, _, h, w = images.shape
    # log is vectorised in blocks of up to 16 with a scalar tail: with whole blocks per row (a 64 x 64 cell grid
    # at any size that is a multiple of 64) every Gumbel key is computed as in the family's own call
    if n & (n - 1) or _cells(h, w) % 16:
        return None
    device = generator.device if generator is not None else torch.device("cpu")
    return torch.rand(b * (_cells(h, w) + _EXTRA), generator=generator, device=device)


_HW: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _hw(h: int, w: int, device: torch.device) -> torch.Tensor:
    """float32 ``[h, w]`` on ``device``, made once (a constant built per call costs ops)."""
    key = (h, w, device)
    if key not in _HW:
        _HW[key] = torch.tensor([h, w], dtype=torch.float32, device=device)
    return _HW[key]


_LUMAS: dict[tuple[int, ...], tuple[list[Any], torch.Tensor]] = {}


def _joined_luma(ops: list[Any], device: torch.device) -> torch.Tensor:
    """The ops' floored cut-out lumas joined (each op's at its bank offset), made once per combination."""
    key = tuple(id(op) for op in ops) + (hash(device),)
    hit = _LUMAS.get(key)
    if hit is None or any(a is not op for a, op in zip(hit[0], ops)):
        if len(_LUMAS) >= 64:  # the entries hold their ops: a process that makes many keeps only recent ones
            _LUMAS.clear()
        hit = _LUMAS[key] = (list(ops), torch.cat([op._luma_on(device) for op in ops]))
    return hit[1]


def place(
    images: torch.Tensor, masks: torch.Tensor | None, parts: list[tuple[Any, list[int], torch.Tensor]]
) -> list[Params]:
    """Params of each part (op, its rows' severities, its :func:`draw`), whose rows are the consecutive first
    rows of ``images`` (part after part), as each op's ``_place`` gives them on its rows alone."""
    luma, free, k = maps_torch(images, masks)
    counts = [len(sev) for _, sev, _ in parts]
    b = sum(counts)
    if b != images.shape[0]:
        luma, free = luma[:b], free[:b]
    h, w = images.shape[-2:]
    side, dev = short_side(h, w), luma.device
    hc, wc = luma.shape[-2:]
    cells = hc * wc
    # per-row tables from each row's family and severity (host values; the float32 roundings of the tables
    # uniform_at reads) and where each row's words lie in its part's draw
    lo, span, radii, masks_bits, offsets, at = [], [], [], [], [], np.empty((b, 4), np.int64)
    row, base, start = 0, 0, 0
    ops = [op for op, _, _ in parts]
    for (op, sev, _), n in zip(parts, counts):
        for i, s in enumerate(sev):
            a, z = op.SIZE_FRAC[s]
            lo.append(np.float32(a))
            span.append(np.float32(z - a))
            radii.append(math.ceil(0.35 * z * side / k))
            masks_bits.append(len(op.bank) - 1)
            offsets.append(start)
            # size, angle, cut-out, flip; the jitter pair and the Gumbel block are read by slices
            at[row + i] = base + np.array([i, n * (cells + 4) + i, n * (cells + 3) + i, n * (cells + 5) + i])
        row, base, start = row + n, base + n * (cells + _EXTRA), start + len(op.bank)
    draws = [(d, n) for (_, _, d), n in zip(parts, counts)]
    join = (lambda ts: torch.cat(ts)) if len(parts) > 1 else (lambda ts: ts[0])  # noqa: E731
    words = join([d for d, _ in draws])
    gumbel = join([d[n : n * (cells + 1)] for d, n in draws])
    jit = join([d[n * (cells + 1) : n * (cells + 3)] for d, n in draws])
    ints = torch.from_numpy(np.stack([masks_bits, np.ones(b, np.int64), offsets], 1))
    floats = torch.from_numpy(np.stack([lo, span], 1))
    if dev.type != "cpu":
        words, gumbel, jit, ints, floats = (t.to(dev) for t in (words, gumbel, jit, ints, floats))
    u_size, u_angle, u_bits = words[torch.from_numpy(at).to(dev)].split([1, 1, 2], 1)
    lo_t, span_t = floats.unbind(1)
    size = (lo_t + span_t * u_size.view(b)) * side  # uniform_at's lo + span * u, then the side
    ok = erode_cells_rows(free, radii)
    score = ok * 1.0 + free * 1e-6
    c0 = pick_cells_from(score, 1, 1e-6 + gumbel.view(b, cells) * (1.0 - 1e-6))[:, 0]
    yx = (torch.stack([c0 // wc, c0 % wc], 1) + jit.view(b, 2)) * k
    cell = cell_index_yx(yx, k, (hc, wc)).view(b, 1)
    vis, near = free.reshape(b, -1).gather(1, cell).view(b), luma.reshape(b, -1).gather(1, cell).view(b)
    bits = (u_bits * _WORD).long() & ints[:, :2]
    idx, flip = bits.unbind(1)
    cl = _joined_luma(ops, dev)[idx + ints[:, 2]]
    # pow is vectorised in blocks with a scalar tail whose last bit can differ: each part's powers taken on
    # its own rows (each row where the family's own call has it), the rest of the gain on all rows at once
    ratio = near / cl
    powed = join([t**0.6 for t in ratio.split(counts)]) if len(parts) > 1 else ratio**0.6
    gain = torch.clip(powed, 0.4, 1.5) * torch.clip(near / 0.45, 0.5, 1.0)
    hw = _hw(h, w, dev)
    params = {
        "index": idx,
        "center_rel": f32(yx / hw),
        "size_rel": f32(size / side),
        "angle": f32(u_angle.view(b) * (2 * math.pi)),
        "flip": flip,
        "gain": f32(gain),
        "visible": f32(vis),
    }
    if len(parts) == 1:
        return [params]
    pieces = {key: v.split(counts) for key, v in params.items()}
    return [{key: pieces[key][i] for key in params} for i in range(len(parts))]
