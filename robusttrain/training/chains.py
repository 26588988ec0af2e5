"""AugMix-style follow-ups: chains of 1..depth perturbation families at random severities, ``width`` of
them mixed with the clean image.

AugMix (Hendrycks et al., ICLR 2020) builds each training copy as ``m * x + (1 - m) * sum_c w_c chain_c(x)``
with ``w ~ Dirichlet(alpha)``, ``m ~ Beta(alpha, alpha)`` and each chain 1-3 random operations: the
copies stay close to the data manifold (the mix keeps the clean image's content) yet cover far more
appearance combinations than one operation at a time — which is what helps on corruptions nobody
simulated. Here the operations are the library's perturbation families (any registered one, severities
capped per family), drawn with the family weights the caller gives. Occluding families (instruments,
text, ...) are left out of chains: blended into a mix they would still cover the lesion.

Batched: per chain and depth step, the images whose chain is still running are grouped by
(family, severity) and each group is one ``apply`` call. Every random number comes from the caller's
CPU generator, and each follow-up's full recipe (mix weight, chain weights, every operation's family,
severity and params) is returned, so :func:`recreate` re-creates it exactly from the clean image.

>>> import torch
>>> from robusttrain.training.worst_of_k import WorstOfK
>>> wok = WorstOfK(["contrast", "blur"], k=1, q=1.0, mix="augmix", chain_depth=3, width=2, seed=0)
>>> x = torch.rand(3, 3, 32, 32); m = torch.zeros(3, 32, 32, dtype=torch.long)
>>> f = wok(x, m, None, step=0)
>>> f.families[0], sorted(f.recipe(0))
(['augmix'], ['chains', 'family', 'mix', 'mixed', 'severity', 'weights'])
>>> bool(torch.equal(f.replay(x, m), f.images))          # re-created from the recorded recipe
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..perturbations.base import host_params

MIXES = ("none", "augmix")
DEFAULT_WIDTH, DEFAULT_ALPHA = 3, 1.0  # AugMix's chains per follow-up and concentration


def unused_chain_argument(mix: str, chain_depth: int, width: int, alpha: float) -> str | None:
    """Why ``width`` or ``alpha`` has no effect with ``mix`` and ``chain_depth`` (None: each one acts): both
    belong to AugMix's mix of chains, so with ``mix="none"`` only their defaults (or ``width=1``) pass.

    >>> unused_chain_argument("none", 1, 3, 2.0)
    "alpha=2.0 is AugMix's mixing concentration, read only with mix='augmix'; set mix='augmix' or leave alpha at 1.0"
    """
    if mix == "none" and width != 1 and (chain_depth > 1 or width != DEFAULT_WIDTH):
        return f"width={width} chains are mixed only with mix='augmix'; with mix='none' use width=1"
    if mix == "none" and alpha != DEFAULT_ALPHA:
        return (
            f"alpha={alpha!r} is AugMix's mixing concentration, read only with mix='augmix'; set "
            f"mix='augmix' or leave alpha at {DEFAULT_ALPHA}"
        )
    return None


LABEL = "augmix"  # the family name a chain follow-up is counted and recorded under

Apply = Callable[
    [str, int, torch.Tensor, "torch.Tensor | None"], "tuple[torch.Tensor, dict[str, torch.Tensor]]"
]


def mix_chains(
    src: torch.Tensor, chains: Sequence[torch.Tensor], m: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """``m * src + (1 - m) * sum_c w[:, c] * chains[c]`` per image (the one formula draw and replay share)."""
    shape = (-1,) + (1,) * (src.ndim - 1)
    acc = w[:, 0].view(shape) * chains[0]
    for c in range(1, len(chains)):
        acc = acc + w[:, c].view(shape) * chains[c]
    mv = m.view(shape)
    return (mv * src + (1 - mv) * acc).clamp(0, 1)


class ChainSampler:
    """Draw ``width`` chains of 1..``depth`` operations per image, mixed as AugMix (``mix="augmix"``)
    or, with ``mix="none"`` (then ``width`` must be 1), one chain applied as is.

    Args:
        families: the families operations are drawn from.
        depth: longest chain (each chain's length is uniform in 1..depth).
        width: chains mixed per follow-up.
        alpha: Dirichlet / Beta concentration (AugMix: 1).
        mix: ``"augmix"`` or ``"none"``.
    """

    def __init__(
        self, families: Sequence[str], depth: int = 3, width: int = 3, alpha: float = 1.0, mix: str = "augmix"
    ):
        if mix not in MIXES:
            raise ValueError(f"mix must be one of {MIXES}, got {mix!r}")
        if mix == "none" and width != 1:
            raise ValueError(
                f"width={width} chains need mix='augmix' to be mixed; with mix='none' use width=1"
            )
        self.families = list(families)
        self.depth, self.width, self.alpha, self.mix = int(depth), int(width), float(alpha), mix

    def draw(
        self,
        src: torch.Tensor,
        masks: torch.Tensor | None,
        probs: np.ndarray,
        caps: Mapping[str, int],
        apply: Apply,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        """Follow-ups of ``src`` (n, C, ...) and each one's recipe (see :func:`recreate`)."""
        n = src.shape[0]
        # one numpy stream per call, seeded from the caller's generator: Beta / Dirichlet draws
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
        if self.mix == "augmix":
            m = rng.beta(self.alpha, self.alpha, n)
            w = rng.dirichlet([self.alpha] * self.width, n)
        else:
            m, w = np.zeros(n), np.ones((n, 1))
        lengths = rng.integers(1, self.depth + 1, (n, self.width))
        p = probs / probs.sum() if probs.sum() > 0 else np.full(len(self.families), 1.0 / len(self.families))
        fam_idx = rng.choice(len(self.families), size=(n, self.width, self.depth), p=p)
        sev_u = rng.random((n, self.width, self.depth))
        recipes: list[dict[str, Any]] = [
            {
                "family": LABEL,
                "severity": 0,
                "mixed": self.mix == "augmix",
                "mix": float(m[i]),
                "weights": [float(v) for v in w[i]],
                "chains": [],
            }
            for i in range(n)
        ]
        outs = []
        for c in range(self.width):
            cur = src.clone()
            ops: list[list[dict[str, Any]]] = [[] for _ in range(n)]
            for d in range(self.depth):
                groups: dict[tuple[str, int], list[int]] = {}
                for i in range(n):
                    if lengths[i, c] > d:
                        fam = self.families[int(fam_idx[i, c, d])]
                        sev = int(sev_u[i, c, d] * caps[fam]) + 1
                        groups.setdefault((fam, sev), []).append(i)
                for (fam, sev), rows in groups.items():
                    r = torch.tensor(rows, device=src.device)
                    out, p = apply(fam, sev, cur[r], None if masks is None else masks[r])
                    cur[r] = out.to(cur.dtype)
                    # the recipe keeps host params: those the apply moved over are still on the host
                    # (no read back per param on an accelerator)
                    host = {k: v.detach().cpu() for k, v in (host_params(p) or p).items()}
                    for j, i in enumerate(rows):
                        ops[i].append(
                            {
                                "family": fam,
                                "severity": sev,
                                "params": {k: v[j : j + 1] for k, v in host.items()},
                            }
                        )
            outs.append(cur)
            for i in range(n):
                recipes[i]["chains"].append(ops[i])
        mt = torch.as_tensor(m, dtype=src.dtype, device=src.device)
        wt = torch.as_tensor(w, dtype=src.dtype, device=src.device)
        out = mix_chains(src, outs, mt, wt) if self.mix == "augmix" else outs[0]
        return out, recipes


def chain_families(recipe: Mapping[str, Any]) -> list[str]:
    """Every family a chain recipe applies (for the occluder rule and the per-family counts)."""
    return [op["family"] for chain in recipe.get("chains", []) for op in chain]


def recreate(
    recipe: Mapping[str, Any],
    image: torch.Tensor,
    mask: torch.Tensor | None,
    replay_op: Callable[
        [str, int, torch.Tensor, torch.Tensor | None, Mapping[str, torch.Tensor]], torch.Tensor
    ],
) -> torch.Tensor:
    """Re-create a chain follow-up of ``image`` (1, C, ...) from its recipe (exact: the draw's arithmetic)."""
    outs = []
    for chain in recipe["chains"]:
        cur = image.clone()
        for op in chain:
            cur = replay_op(op["family"], int(op["severity"]), cur, mask, op["params"]).to(cur.dtype)
        outs.append(cur)
    if not recipe["mixed"]:
        return outs[0]
    m = torch.tensor([recipe["mix"]], dtype=torch.float64).to(image.dtype).to(image.device)
    w = torch.tensor([recipe["weights"]], dtype=torch.float64).to(image.dtype).to(image.device)
    return mix_chains(image, outs, m, w)
