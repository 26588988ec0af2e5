"""Speed of the perturbation library against the closest Albumentations / Kornia transforms.

For each perturbation at SIZE x SIZE (default 512) it measures, side by side in one run, images/s of

* ``numpy``  — our numpy path, one uint8 HWC image per call, params sampled per call;
* ``albu``   — the closest built-in Albumentations transform on the same image;
* ``torch``  — our batched torch path on CPU (B images per call, params sampled per call);
* ``kornia`` — the closest Kornia augmentation on the same CPU batch;
* ``cuda`` / ``k-cuda`` — both torch figures on the GPU, when one is available.

Every figure is the median over ``--repeats`` rounds; within a round all variants of a perturbation run
back to back, so noise from other processes hits them alike and the ratios stay meaningful. On CUDA the
colour families are also reported as a fraction of the device's copy bandwidth (one read + one write
of the batch, measured with ``Tensor.copy_``).

Run: ``python benchmarks/perturbations.py [--quick] [--size 512] [--batch 32] [--repeats 5]``
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import albumentations as A
import cv2
import kornia.augmentation as K
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
import robusttrain.perturbations as P  # noqa: E402

FONT = next((str(p) for p in (Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
                              Path("/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf")) if p.exists()), None)


def frame(size: int) -> tuple[np.ndarray, np.ndarray]:
    """A real Kvasir frame when available (else a synthetic endoscopy-like one) and a lesion mask."""
    root = Path(__file__).resolve().parents[2] / "shared" / "data" / "kvasir_seg"
    imgs = sorted((root / "images").glob("*.jpg")) if root.is_dir() else []
    if imgs:
        img = cv2.resize(cv2.imread(str(imgs[0]))[:, :, ::-1], (size, size), interpolation=cv2.INTER_AREA)
        m = cv2.imread(str(root / "masks" / imgs[0].name), cv2.IMREAD_GRAYSCALE)
        mask = (cv2.resize(m, (size, size), interpolation=cv2.INTER_NEAREST) > 127).astype(np.int64)
        return np.ascontiguousarray(img), mask
    yy, xx = np.mgrid[:size, :size]
    img = np.stack([170 + 40 * np.sin(xx / 20), 90 + 30 * np.cos(yy / 15), 70 + 0 * xx], -1).astype(np.uint8)
    mask = np.zeros((size, size), np.int64)
    mask[size // 3: size // 2, size // 3: size // 2] = 1
    return img, mask


def rate(fn: Callable[[], object], n_images: int, min_time: float, sync: Callable[[], None] = lambda: None) -> float:
    """Images per second of ``fn`` (which processes ``n_images`` per call), running for >= min_time."""
    fn()
    sync()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        if calls >= 2 or time.perf_counter() - t0 >= min_time:
            sync()
            dt = time.perf_counter() - t0
            if dt >= min_time or calls >= 200:
                return calls * n_images / dt


def cases(size: int):
    """(label, perturbation, albumentations reference, kornia reference factory)."""
    text_meta = {"bbox": (0.02, 0.85, 0.45, 0.97), "text": "15/03/2012 00:05:02 CVP:1"}
    albu_text = A.TextImage(font_path=FONT, font_color=(255, 255, 255), p=1.0) if FONT else None
    return [
        ("saturation", P.get("saturation", 3), A.ColorJitter(0, 0, (1.5, 1.5), 0, p=1.0),
         lambda: K.ColorJitter(0.0, 0.0, (1.5, 1.5), 0.0, p=1.0), {}),
        # contrast lowers brightness, contrast and saturation together: ColorJitter is the closest match;
        # RandomBrightnessContrast (one LUT, no saturation change) is listed as a second reference.
        ("contrast", P.get("contrast", 3), A.ColorJitter((0.7, 0.7), (0.7, 0.7), (0.7, 0.7), 0, p=1.0),
         lambda: K.ColorJitter((0.7, 0.7), (0.7, 0.7), (0.7, 0.7), 0.0, p=1.0), {}),
        ("contrast/RBC", P.get("contrast", 3), A.RandomBrightnessContrast((-0.3, -0.3), (-0.3, -0.3), p=1.0),
         None, {}),
        ("white_balance", P.get("white_balance", 3), A.RGBShift((-60, -60), (0, 0), (-60, -60), p=1.0),
         lambda: K.RandomPlanckianJitter(p=1.0), {}),
        ("specularity", P.get("specularity", 3), A.RandomSunFlare(method="overlay", p=1.0), None, {}),
        ("blur s=5", _blur_fixed(5.0, False), A.GaussianBlur(blur_limit=0, sigma_limit=(5, 5), p=1.0),
         lambda: K.RandomGaussianBlur((31, 31), (5.0, 5.0), p=1.0), {}),
        ("blur s=15", _blur_fixed(15.0, False), A.GaussianBlur(blur_limit=0, sigma_limit=(15, 15), p=1.0),
         lambda: K.RandomGaussianBlur((91, 91), (15.0, 15.0), p=1.0), {}),
        ("blur s=15 fast", _blur_fixed(15.0, True), A.GaussianBlur(blur_limit=0, sigma_limit=(15, 15), p=1.0),
         None, {}),
        ("motion_blur", P.get("motion_blur", 3), A.MotionBlur(blur_limit=(17, 17), p=1.0),
         lambda: K.RandomMotionBlur(17, (0.0, 180.0), (-1.0, 1.0), p=1.0), {}),
        ("instrument", P.get("instrument", 3), None, None, {}),
        ("feces", P.get("feces", 3), None, None, {}),
        ("blood", P.get("blood", 3), None, None, {}),
        ("text", P.get("text", 3), albu_text, None, {"textimage_metadata": text_meta}),
        ("text inplace", P.get("text", 3, inplace=True), albu_text, None, {"textimage_metadata": text_meta}),
        ("melt", P.get("melt", 3), None, None, {}),
    ]


class _blur_fixed(P.Blur):
    """Blur at a fixed sigma (px on the benchmark's SIZE x SIZE frames), so it compares with a fixed-sigma
    reference. Params are relative (fractions of the shorter side), hence the division by the size."""

    size = 512

    def __init__(self, sigma: float, fast: bool):
        super().__init__(severity=5, fast=fast)
        self._sigma = sigma

    def _draw(self, r, b):
        d = super()._draw(r, b)
        d["sigma_rel"] = d["sigma_rel"] * 0 + self._sigma / self.size
        return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run: 2 repeats, 0.3 s per figure, B=8")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--only", nargs="*", help="labels to run (default: all)")
    args = ap.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    min_time = 0.3 if args.quick else 1.0
    b = args.batch or (8 if args.quick else 32)
    cuda = torch.cuda.is_available()

    _blur_fixed.size = args.size
    img, mask = frame(args.size)
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float().div(255).repeat(b, 1, 1, 1).contiguous()
    m = torch.from_numpy(mask)[None].repeat(b, 1, 1)
    xc, mc = (x.cuda(), m.cuda()) if cuda else (None, None)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    print(f"# {args.size}x{args.size}, torch batch B={b}, {torch.get_num_threads()} torch threads, "
          f"cv2 threads {cv2.getNumThreads()}, medians of {repeats} rounds; "
          f"{'CUDA: ' + torch.cuda.get_device_name() if cuda else 'no CUDA'}")
    bw = None
    if cuda:
        buf = torch.empty_like(xc)
        bw = statistics.median(rate(lambda: buf.copy_(xc), b, min_time, sync) for _ in range(3))
        print(f"# CUDA copy bound (one read + one write of the batch): {bw:,.0f} img/s")

    head = f"{'perturbation':<15}{'numpy':>9}{'albu':>9}{'np/albu':>9}{'torch':>9}{'kornia':>9}{'t/kornia':>9}"
    if cuda:
        head += f"{'cuda':>10}{'k-cuda':>10}{'c/k':>7}{'%copy':>7}"
    print(head)
    for label, pert, albu, kornia_f, extra in cases(args.size):
        if args.only and label not in args.only:
            continue
        rng = np.random.default_rng(0)
        gen = torch.Generator().manual_seed(0)
        kor = kornia_f() if kornia_f else None
        work = img.copy()
        fns: dict[str, tuple[Callable[[], object], int, Callable[[], None]]] = {
            "numpy": (lambda: pert.apply_numpy(work, mask, rng=rng), 1, lambda: None),
            "torch": (lambda: pert.apply_batch(x, m, generator=gen), b, lambda: None),
        }
        if albu is not None:
            fns["albu"] = (lambda: albu(image=img, **extra), 1, lambda: None)
        if kor is not None:
            fns["kornia"] = (lambda: kor(x), b, lambda: None)
        if cuda and label != "melt":
            fns["cuda"] = (lambda: pert.apply_batch(xc, mc, generator=gen), b, sync)
            if kor is not None:
                korc = kornia_f().cuda()
                fns["k-cuda"] = (lambda: korc(xc), b, sync)
        res: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(repeats):
            for k, (fn, n, s) in fns.items():
                res[k].append(rate(fn, n, min_time, s))
        med = {k: statistics.median(v) for k, v in res.items()}

        def f(k: str, w: int = 9) -> str:
            return f"{med[k]:>{w},.0f}" if k in med else f"{'-':>{w}}"

        def r(a: str, c: str, w: int = 9) -> str:
            return f"{med[a] / med[c]:>{w - 1}.2f}x" if a in med and c in med else f"{'-':>{w}}"

        line = f"{label:<15}{f('numpy')}{f('albu')}{r('numpy', 'albu')}{f('torch')}{f('kornia')}{r('torch', 'kornia')}"
        if cuda:
            pct = (f"{100 * med['cuda'] / bw:>6.0f}%" if bw and "cuda" in med and label in
                   ("saturation", "contrast", "white_balance") else f"{'-':>7}")
            line += f"{f('cuda', 10)}{f('k-cuda', 10)}{r('cuda', 'k-cuda', 7)}{pct}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
