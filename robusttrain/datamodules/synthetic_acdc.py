"""Procedural short-axis cardiac MRI slices with ACDC labels (0 bg, 1 RV, 2 MYO, 3 LV cavity).

A case is patient × phase (``synpat012_ED`` / ``synpat012_ES``) with 6–10 slices, slice 0 at the
base and the last at the apex (as in ACDC). Per patient: heart position/size/orientation and tissue
intensities; ES has a smaller cavity and thicker wall; the RV crescent fades out towards the apex.
Images get a smooth bias field, partial-volume blur and Rician noise. Each slice is drawn from
seeds ``[seed, patient, …]`` alone, so any slice can be regenerated on its own.

Planted corner cases (modelled on ACDC Patient057) are ``round(hard_fraction * n_cases)`` cases
(at least one) with prominent papillary muscles: large myocardium-intensity blobs inside the LV
cavity, labelled LV cavity as in ACDC; every second one also has a thin, low-contrast RV
(kind ``papillary_thin_rv``).

Example::

    >>> from robusttrain.datamodules.synthetic_acdc import SyntheticACDCSource
    >>> src = SyntheticACDCSource(n_patients=10, seed=0, image_size=96)
    >>> img, mask = src.load(0); img.shape, sorted(set(mask.ravel().tolist())), src.case_id(0)
    ((96, 96), [0, 1, 2, 3], 'synpat000_ED')
"""

from __future__ import annotations

import cv2
import numpy as np

from ._noise import MemoCache, grid, smooth_noise, star_radius

PHASES = ("ED", "ES")
HARD_KINDS = ("papillary", "papillary_thin_rv")


def _n_slices(seed: int, pid: int) -> int:
    return int(np.random.default_rng([seed, pid, 11]).integers(6, 11))


def _patient(seed: int, pid: int) -> dict:
    r = np.random.default_rng([seed, pid, 1])
    return dict(
        cy=0.5 + r.uniform(-0.06, 0.06),
        cx=0.52 + r.uniform(-0.06, 0.06),
        r_lv=r.uniform(0.075, 0.12),
        th=r.uniform(0.022, 0.036),
        es=r.uniform(0.6, 0.78),
        th_es=r.uniform(1.2, 1.45),
        rv_dir=np.pi - 0.35 + r.uniform(-0.35, 0.35),
        rv_w=r.uniform(0.035, 0.07),
        rv_span=r.uniform(0.9, 1.3),
        blood=r.uniform(0.68, 0.92),
        rv_blood=r.uniform(0.85, 1.0),
        myo=r.uniform(0.2, 0.34),
        tissue=r.uniform(0.3, 0.45),
        fat=r.uniform(0.65, 0.85),
        body=(r.uniform(0.36, 0.44), r.uniform(0.3, 0.36)),
        lung=r.uniform(0.03, 0.1),
        liver=(r.uniform(0.62, 0.75), r.uniform(0.25, 0.45)),
        pm_ang=r.uniform(0.5, 0.9),
        pm_big=r.uniform(0.26, 0.36),
        n_pm=int(r.integers(2, 4)),
        seed_shape=int(r.integers(1 << 30)),
    )


def render_acdc_slice(
    seed: int, pid: int, phase: str, s: int, n_slices: int, size: int = 128, hard: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One slice: float32 (H,W) image in [0,1] and uint8 (H,W) label. ``s=0`` is the base."""
    p = _patient(seed, pid)
    ph = PHASES.index(phase)
    rng = np.random.default_rng([seed, pid, ph, 3, s])
    shape_rng = np.random.default_rng(p["seed_shape"])  # the same wall shape on every slice/phase
    y, x = grid(size)
    z = 1.0 - s / max(n_slices - 1, 1)  # 1 = base, 0 = apex
    cy, cx = p["cy"] + rng.normal(0, 0.004), p["cx"] + rng.normal(0, 0.004)  # breath-hold jitter

    # anatomy around the heart: body ellipse with fat rim, lungs, liver
    by, bx = p["body"]
    db = np.hypot((y - 0.52) / by, (x - 0.5) / bx)
    img: np.ndarray = np.where(db < 1, p["tissue"], 0.02).astype(np.float32)
    img += (0.08 * smooth_noise(rng, size, 12)) * (db < 1)
    img = np.where((db > 0.9) & (db < 1), p["fat"], img)
    for ly, lx in ((0.42, 0.5 + 0.24), (0.38, 0.5 - 0.26)):
        dl = np.hypot((y - ly) / 0.16, (x - lx) / 0.1)
        img = np.where((dl < 1) & (db < 0.85), p["lung"], img)
    ly, lx = p["liver"]
    img = np.where(np.hypot((y - ly) / 0.12, (x - lx) / 0.16) < 1, p["tissue"] + 0.08, img)

    # LV cavity and myocardium, scaled from base to apex; ES: smaller cavity, thicker wall
    sc = 0.3 + 0.7 * z**0.6
    cav = p["r_lv"] * sc * (p["es"] if ph else 1.0) - 0.02 * (z < 0.15)
    th = p["th"] * (p["th_es"] if ph else 1.0)
    dy, dx = y - cy, x - cx
    d, ang = np.hypot(dy, dx), np.arctan2(dy, dx)
    r_cav = star_radius(shape_rng, ang, max(cav, 1e-3), 0.12)
    r_out = r_cav + star_radius(shape_rng, ang, th, 0.3)
    lv = (d < r_cav) & (cav > 0.004)
    myo = (d < r_out) & ~lv

    # RV crescent hugging the septum, only in the basal two thirds
    rv = np.zeros_like(lv)
    if z > 0.3:
        thin = hard == "papillary_thin_rv"
        dphi = np.angle(np.exp(1j * (ang - p["rv_dir"])))
        prof = np.clip(np.cos(0.5 * np.pi * dphi / p["rv_span"]), 0, 1) ** 0.7
        w = p["rv_w"] * np.sqrt((z - 0.3) / 0.7) * (0.75 if ph else 1.0) * (0.5 if thin else 1.0)
        gap = 0.006
        rv = (d > r_out + gap) & (d < r_out + gap + w * prof * 2.2) & (np.abs(dphi) < p["rv_span"])
        rv_wall = (
            (d > r_out) & (d < r_out + gap + w * prof * 2.2 + 0.008) & (np.abs(dphi) < p["rv_span"] + 0.1)
        )
        img = np.where(rv_wall, p["myo"] + 0.05, img)
        rv_int = p["blood"] * p["rv_blood"]
        if thin:  # low contrast: RV blood only a little brighter than myocardium
            rv_int = p["myo"] + 0.3 * (rv_int - p["myo"])
        img = np.where(rv, rv_int, img)

    img = np.where(myo, p["myo"], img)
    img = np.where(lv, p["blood"], img)

    # papillary muscles: small grey blobs normally, large myocardium-intensity ones in corner cases
    big = hard is not None
    if cav > 0.01 and (0.2 < z < 0.85 or (big and 0.1 < z < 0.97)):
        base_ang = p["rv_dir"] + np.pi
        n_pm = p["n_pm"] if big else 2
        for k in range(n_pm):
            a = base_ang + p["pm_ang"] * (2 * k / max(n_pm - 1, 1) - 1)
            r_ed = p["r_lv"] * sc
            rad = (p["pm_big"] * r_ed * (0.9 if ph else 1.0)) if big else 0.1 * cav
            off = max(cav - 0.8 * rad, 0.0)
            pm = np.hypot(y - cy - off * np.sin(a), x - cx - off * np.cos(a)) < rad
            pm &= lv
            inten = p["myo"] + 0.02 if big else 0.5 * (p["myo"] + p["blood"])
            img = np.where(pm, inten, img)

    img = img * (1 + 0.05 * smooth_noise(rng, size, 20))  # tissue texture
    img = cv2.GaussianBlur(img.astype(np.float32), (0, 0), 0.7)  # partial volume
    np.multiply(img, 1 + 0.18 * smooth_noise(rng, size, 2), out=img)  # coil bias field (in place: float32)
    sigma = rng.uniform(0.02, 0.045)
    img = np.sqrt(
        (img + sigma * rng.standard_normal(img.shape, dtype=np.float32)) ** 2
        + (sigma * rng.standard_normal(img.shape, dtype=np.float32)) ** 2
    )  # Rician
    label = np.zeros((size, size), np.uint8)
    label[rv] = 1
    label[myo] = 2
    label[lv] = 3
    return np.clip(img, 0, 1).astype(np.float32), label


class SyntheticACDCSource:
    """Synthetic patients ``start … start+n_patients-1``, each with an ED and an ES case.

    Samples are slices; ``hard_cases`` maps the planted case ids to their kind.
    """

    def __init__(
        self,
        n_patients: int,
        seed: int = 0,
        image_size: int = 128,
        hard_fraction: float = 0.1,
        start: int = 0,
    ):
        self.seed, self.size, self.start = int(seed), int(image_size), int(start)
        self._cache = MemoCache()  # slices are deterministic: generate each once
        self.cases = [(start + i, ph) for i in range(int(n_patients)) for ph in PHASES]
        counts = [_n_slices(self.seed, pid) for pid, _ in self.cases]
        self._case_of = np.repeat(np.arange(len(self.cases)), counts)
        self._slice_of = np.concatenate([np.arange(c) for c in counts]) if counts else np.zeros(0, int)
        self._counts = counts
        self.hard_cases: dict[str, str] = {}
        if hard_fraction > 0 and self.cases:
            k = min(len(self.cases), max(1, int(round(hard_fraction * len(self.cases)))))
            pick = np.random.default_rng([self.seed, self.start, int(n_patients), 4241]).choice(
                len(self.cases), k, replace=False
            )
            for j, c in enumerate(sorted(pick.tolist())):
                self.hard_cases[self._name(c)] = HARD_KINDS[j % 2]

    def _name(self, c: int) -> str:
        pid, ph = self.cases[c]
        return f"synpat{pid:03d}_{ph}"

    def __len__(self) -> int:
        return len(self._case_of)

    def case_id(self, i: int) -> str:
        return self._name(int(self._case_of[i]))

    def slice_index(self, i: int) -> int:
        return int(self._slice_of[i])

    def load(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        c = int(self._case_of[i])
        pid, ph = self.cases[c]
        return self._cache.get(
            i,
            lambda: render_acdc_slice(
                self.seed,
                pid,
                ph,
                int(self._slice_of[i]),
                self._counts[c],
                self.size,
                self.hard_cases.get(self._name(c)),
            ),
        )
