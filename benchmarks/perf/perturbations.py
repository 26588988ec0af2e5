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

Run: ``python -m benchmarks.perf.perturbations [--quick] [--size 512] [--batch 32] [--repeats 5]``

``--modality mri`` / ``xray`` measures the single-channel families instead (real ACDC slices / Shenzhen
radiographs from ``../shared/data`` when present, else a phantom), against the closest MONAI and TorchIO
transforms applied per sample (their usual use, in a Dataset's transform chain):
``numpy`` (ours, one uint8 image per call), ``monai`` / ``tio`` (one (1,H,W) / (1,H,W,1) float tensor per
call; per-sample callers take the batch's images in turn, so no image stays cache-hot), ``torch`` (ours, B images per call on CPU) and the ratios ``t/monai``, ``t/tio``. Target: the
batched torch path at least 3x MONAI's per-sample transform on CPU. TorchIO is a benchmark-only
dependency (``pip install -e .[bench]``). Default size 256 (ACDC's grid; radiographs 512 with ``--size``).

``--adapter`` measures the Albumentations adapter (issue 19.3) instead: for every family with a transform, at
512² and 128² (or ``--size``), µs per call of the bare kernel (``apply_numpy``, params sampled per call) and of
the transform called as Albumentations calls it (``t(image=..., mask=...)``), on the same stream of params
(the transform draws from its ``random_generator``, seeded per round; the bare calls draw from a generator
seeded alike, so both do identical work; the first outputs are checked equal; an untimed pass over each
round's params warms the param-keyed caches first), plus the closest Albumentations transform for the colour
families. The overhead
column is the median over rounds of the per-round ratio; the header states the library versions and
``os.getloadavg()`` at start and end, since both move the figures. Run it with ``OMP_NUM_THREADS=1``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import albumentations as A
import cv2
import kornia.augmentation as K
import numpy as np
import torch

import robusttrain.perturbations as P
from benchmarks.common import Results, add_json_argument, imread
from benchmarks.paths import DATA_ROOT

FONT = next(
    (
        str(p)
        for p in (
            Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
            Path("/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf"),
        )
        if p.exists()
    ),
    None,
)


def frame(size: int) -> tuple[np.ndarray, np.ndarray]:
    """A real Kvasir frame when available (else a synthetic endoscopy-like one) and a lesion mask."""
    root = DATA_ROOT / "kvasir_seg"
    imgs = sorted((root / "images").glob("*.jpg")) if root.is_dir() else []
    if imgs:
        img = cv2.resize(imread(imgs[0])[:, :, ::-1], (size, size), interpolation=cv2.INTER_AREA)
        m = imread(root / "masks" / imgs[0].name, cv2.IMREAD_GRAYSCALE)
        mask = (cv2.resize(m, (size, size), interpolation=cv2.INTER_NEAREST) > 127).astype(np.int64)
        return np.ascontiguousarray(img), mask
    yy, xx = np.mgrid[:size, :size]
    img = np.stack([170 + 40 * np.sin(xx / 20), 90 + 30 * np.cos(yy / 15), 70 + 0 * xx], -1).astype(np.uint8)
    mask = np.zeros((size, size), np.int64)
    mask[size // 3 : size // 2, size // 3 : size // 2] = 1
    return img, mask


def rate(
    fn: Callable[[], object], n_images: int, min_time: float, sync: Callable[[], None] = lambda: None
) -> float:
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


RATE, RATIO = "{:,.0f}", "{:.2f}x"  # images/s; a ratio of two of them


def fixed_width(label: str, values: list, widths: list[int], formats: list[str]) -> str:
    """One row as printed: the label left-aligned in 15 characters, each value right-aligned in its width
    (``-`` where there is none), formatted as the JSON table's column is.

    >>> fixed_width("blur", [1234.4, None, 2.345], [9, 9, 9], [RATE, RATE, RATIO])
    'blur               1,234        -    2.35x'
    """
    cells = ("-" if v is None else f.format(v) for v, f in zip(values, formats))
    return f"{label:<15}" + "".join(c.rjust(w) for c, w in zip(cells, widths))


def ratio(med: dict[str, float], a: str, c: str) -> float | None:
    return med[a] / med[c] if a in med and c in med else None


def medians(fns: dict, repeats: int, min_time: float) -> dict[str, float]:
    """Median images/s of each variant over ``repeats`` rounds, the variants back to back in a round."""
    res: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, (fn, n, s) in fns.items():
            res[k].append(rate(fn, n, min_time, s))
    return {k: statistics.median(v) for k, v in res.items()}


def cases(size: int):
    """(label, perturbation, albumentations reference, kornia reference factory)."""
    text_meta = {"bbox": (0.02, 0.85, 0.45, 0.97), "text": "15/03/2012 00:05:02 CVP:1"}
    albu_text = A.TextImage(font_path=FONT, font_color=(255, 255, 255), p=1.0) if FONT else None
    return [
        (
            "saturation",
            P.get("saturation", 3),
            A.ColorJitter(0, 0, (1.5, 1.5), 0, p=1.0),
            lambda: K.ColorJitter(0.0, 0.0, (1.5, 1.5), 0.0, p=1.0),
            {},
        ),
        # contrast lowers brightness, contrast and saturation together: ColorJitter is the closest match;
        # RandomBrightnessContrast (one LUT, no saturation change) is listed as a second reference.
        (
            "contrast",
            P.get("contrast", 3),
            A.ColorJitter((0.7, 0.7), (0.7, 0.7), (0.7, 0.7), 0, p=1.0),
            lambda: K.ColorJitter((0.7, 0.7), (0.7, 0.7), (0.7, 0.7), 0.0, p=1.0),
            {},
        ),
        (
            "contrast/RBC",
            P.get("contrast", 3),
            A.RandomBrightnessContrast((-0.3, -0.3), (-0.3, -0.3), p=1.0),
            None,
            {},
        ),
        (
            "white_balance",
            P.get("white_balance", 3),
            A.RGBShift((-60, -60), (0, 0), (-60, -60), p=1.0),
            lambda: K.RandomPlanckianJitter(p=1.0),
            {},
        ),
        ("specularity", P.get("specularity", 3), A.RandomSunFlare(method="overlay", p=1.0), None, {}),
        (
            "blur s=5",
            _blur_fixed(5.0, False),
            A.GaussianBlur(blur_limit=0, sigma_limit=(5, 5), p=1.0),
            lambda: K.RandomGaussianBlur((31, 31), (5.0, 5.0), p=1.0),
            {},
        ),
        (
            "blur s=15",
            _blur_fixed(15.0, False),
            A.GaussianBlur(blur_limit=0, sigma_limit=(15, 15), p=1.0),
            lambda: K.RandomGaussianBlur((91, 91), (15.0, 15.0), p=1.0),
            {},
        ),
        (
            "blur s=15 fast",
            _blur_fixed(15.0, True),
            A.GaussianBlur(blur_limit=0, sigma_limit=(15, 15), p=1.0),
            None,
            {},
        ),
        (
            "motion_blur",
            P.get("motion_blur", 3),
            A.MotionBlur(blur_limit=(17, 17), p=1.0),
            lambda: K.RandomMotionBlur(17, (0.0, 180.0), (-1.0, 1.0), p=1.0),
            {},
        ),
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run: 2 repeats, 0.3 s per figure, B=8")
    ap.add_argument(
        "--size", type=int, default=None, help="image side (default 512; 256 for --modality mri/xray)"
    )
    ap.add_argument("--modality", choices=("endoscopy", "mri", "xray"), default="endoscopy")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--only", nargs="*", help="labels to run (default: all)")
    ap.add_argument(
        "--cuda-only",
        action="store_true",
        help="only the GPU columns (cuda, k-cuda, c/k, %%copy); needs CUDA",
    )
    ap.add_argument(
        "--adapter", action="store_true", help="Albumentations adapter vs bare kernel (issue 19.3)"
    )
    add_json_argument(ap)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.cuda_only and not cuda:
        raise SystemExit(
            "perturbations.py --cuda-only: no CUDA device here (torch.cuda.is_available() is False)"
        )
    # the adapter is measured on the CPU alone (numpy kernels), the other modes on the GPU too when there is one
    device = "cuda" if cuda and not args.adapter else "cpu"
    results = Results("benchmarks.perf.perturbations", args, device=device, argv=argv)
    print(results.header_line())
    if args.adapter:
        main_adapter(args, results)
    elif args.modality != "endoscopy":
        main_grey(args, results)
    else:
        main_colour(args, results)
    results.write(args.json)


def main_colour(args: argparse.Namespace, results: Results) -> None:
    """The endoscopy families vs Albumentations (numpy) and Kornia (torch, CPU and CUDA)."""
    args.size = args.size or 512
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

    print(
        f"# {args.size}x{args.size}, torch batch B={b}, {torch.get_num_threads()} torch threads, "
        f"cv2 threads {cv2.getNumThreads()}, medians of {repeats} rounds; "
        f"{'CUDA: ' + torch.cuda.get_device_name() if cuda else 'no CUDA'}"
    )
    bw = None
    if xc is not None:
        buf, src = torch.empty_like(xc), xc
        bw = statistics.median(rate(lambda: buf.copy_(src), b, min_time, sync) for _ in range(3))
        print(f"# CUDA copy bound (one read + one write of the batch): {bw:,.0f} img/s")
    results.notes |= {"batch": b, "size": args.size, "repeats": repeats, "cv2_threads": cv2.getNumThreads()}
    if cuda:
        results.notes |= {"cuda_device": torch.cuda.get_device_name(), "cuda_copy_bound_img_s": bw}

    # images/s (numpy, albu, torch, kornia, cuda, k-cuda) and their ratios; %copy: cuda / the copy bound
    cols = ["numpy", "albu", "np/albu", "torch", "kornia", "t/kornia"]
    widths, fmts = [9] * 6, [RATE, RATE, RATIO, RATE, RATE, RATIO]
    if cuda:
        cols, widths = cols + ["cuda", "k-cuda", "c/k", "%copy"], widths + [10, 10, 7, 7]
        fmts = fmts + [RATE, RATE, RATIO, "{:.0f}%"]
    print(f"{'perturbation':<15}" + "".join(c.rjust(w) for c, w in zip(cols, widths)))
    rows = []
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
        if args.cuda_only:  # the CPU columns at 512^2 x 64 would take minutes of a GPU lease
            fns.clear()
        if cuda and label != "melt":
            fns["cuda"] = (lambda: pert.apply_batch(xc, mc, generator=gen), b, sync)
            if kor is not None:
                korc = kornia_f().cuda()
                fns["k-cuda"] = (lambda: korc(xc), b, sync)
        med = medians(fns, repeats, min_time)
        row = [med.get("numpy"), med.get("albu"), ratio(med, "numpy", "albu")]
        row += [med.get("torch"), med.get("kornia"), ratio(med, "torch", "kornia")]
        if cuda:
            colour = label in ("saturation", "contrast", "white_balance")
            row += [med.get("cuda"), med.get("k-cuda"), ratio(med, "cuda", "k-cuda")]
            row += [100 * med["cuda"] / bw if colour and bw and "cuda" in med else None]
        print(fixed_width(label, row, widths, fmts), flush=True)
        rows.append([label, *row])
    results.table("endoscopy", ["perturbation", *cols], rows, dict(zip(cols, fmts)))


# --------------------------------------------------------------------------------------
# single-channel families vs MONAI / TorchIO
# --------------------------------------------------------------------------------------
def grey_frames(modality: str, size: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """(B,size,size) uint8 slices / radiographs and int64 masks: real shared data when present."""
    root = DATA_ROOT
    imgs, masks = [], []
    if modality == "mri" and (root / "acdc" / "volumes").is_dir():
        import h5py

        for f in sorted((root / "acdc" / "volumes").glob("*.h5")):
            with h5py.File(f) as h:
                for k in range(h["image"].shape[0]):
                    imgs.append(
                        cv2.resize(
                            (np.clip(h["image"][k], 0, 1) * 255 + 0.5).astype(np.uint8),
                            (size, size),
                            interpolation=cv2.INTER_AREA,
                        )
                    )
                    masks.append(cv2.resize(h["label"][k], (size, size), interpolation=cv2.INTER_NEAREST))
            if len(imgs) >= b:
                break
    elif modality == "xray" and (root / "shenzhen_cxr" / "images").is_dir():
        for f in sorted((root / "shenzhen_cxr" / "images").glob("*.jpg"))[:b]:
            imgs.append(
                cv2.resize(imread(f, cv2.IMREAD_GRAYSCALE), (size, size), interpolation=cv2.INTER_AREA)
            )
            mk = imread(root / "shenzhen_cxr" / "masks" / f.name, cv2.IMREAD_GRAYSCALE)
            masks.append(
                (cv2.resize(mk, (size, size), interpolation=cv2.INTER_NEAREST) > 127).astype(np.uint8)
            )
    if not imgs:  # phantom: a bright ellipse with a ring on a dark background
        yy, xx = np.mgrid[:size, :size] / size - 0.5
        r = (yy / 0.38) ** 2 + (xx / 0.42) ** 2
        imgs = [np.clip(30 + 150 * (r < 1) + 50 * ((r > 0.2) & (r < 0.35)), 0, 255).astype(np.uint8)]
        masks = [((r > 0.2) & (r < 0.35)).astype(np.uint8)]
    idx = [i % len(imgs) for i in range(b)]
    return np.stack([imgs[i] for i in idx]), np.stack([masks[i] for i in idx]).astype(np.int64)


def grey_cases(modality: str):
    """(label, perturbation, MONAI factory, TorchIO factory): the closest per-sample references."""
    import monai.transforms as M

    try:
        import torchio as tio
    except ImportError:  # benchmark-only dependency
        tio = None

    def t(f):
        return (lambda: f()) if tio is not None else None

    if modality == "mri":
        return [
            (
                "bias_field",
                P.get("bias_field", 3),
                lambda: M.RandBiasField(degree=3, coeff_range=(0.2, 0.3), prob=1.0),
                t(lambda: tio.RandomBiasField(coefficients=0.5, order=3)),
            ),
            (
                "ghosting",
                P.get("ghosting", 3),
                None,  # MONAI has no ghosting transform
                t(lambda: tio.RandomGhosting(num_ghosts=(2, 5), axes=(0, 1), intensity=(0.3, 0.6))),
            ),
            (
                "gibbs",
                P.get("gibbs", 3),
                lambda: M.RandGibbsNoise(prob=1.0, alpha=(0.4, 0.6)),
                None,
            ),  # none in TorchIO
            (
                "spike",
                P.get("spike", 3),
                lambda: M.RandKSpaceSpikeNoise(prob=1.0, intensity_range=(10.0, 12.0)),
                t(lambda: tio.RandomSpike(num_spikes=1, intensity=(0.3, 0.5))),
            ),
            (
                "rician_noise",
                P.get("rician_noise", 3),
                lambda: M.RandRicianNoise(prob=1.0, std=0.04),
                t(lambda: tio.RandomNoise(std=0.04)),
            ),  # TorchIO: Gaussian, the closest
            (
                "gamma",
                P.get("gamma", 3),
                lambda: M.RandAdjustContrast(prob=1.0, gamma=(0.7, 1.5)),
                t(lambda: tio.RandomGamma(log_gamma=0.3)),
            ),
            (
                "blur",
                P.get("blur", 3),
                lambda: M.RandGaussianSmooth(sigma_x=(3.0, 5.0), sigma_y=(3.0, 5.0), prob=1.0),
                t(lambda: tio.RandomBlur(std=(3.0, 5.0))),
            ),
            (
                "contrast",
                P.get("contrast", 3),
                lambda: M.RandScaleIntensityFixedMean(prob=1.0, factors=0.3),
                None,
            ),
        ]
    return [
        (
            "quantum_noise",
            P.get("quantum_noise", 3),
            lambda: M.RandGaussianNoise(prob=1.0, std=0.03),
            t(lambda: tio.RandomNoise(std=0.03)),
        ),
        (
            "exposure",
            P.get("exposure", 3),
            lambda: M.RandAdjustContrast(prob=1.0, gamma=(0.7, 1.5)),
            t(lambda: tio.RandomGamma(log_gamma=0.3)),
        ),
        (
            "blur",
            P.get("blur", 3),
            lambda: M.RandGaussianSmooth(sigma_x=(3.0, 5.0), sigma_y=(3.0, 5.0), prob=1.0),
            t(lambda: tio.RandomBlur(std=(3.0, 5.0))),
        ),
        ("xray_markers", P.get("xray_markers", 3), None, None),
        ("collimation", P.get("collimation", 3), None, None),
        (
            "contrast",
            P.get("contrast", 3),
            lambda: M.RandScaleIntensityFixedMean(prob=1.0, factors=0.3),
            None,
        ),
    ]


def main_grey(args: argparse.Namespace, results: Results) -> None:
    size = args.size or 256
    repeats = args.repeats or (2 if args.quick else 5)
    min_time = 0.3 if args.quick else 1.0
    b = args.batch or (8 if args.quick else 32)
    cuda = torch.cuda.is_available()
    imgs, masks = grey_frames(args.modality, size, b)
    x = torch.from_numpy(imgs)[:, None].float().div(255).contiguous()
    m = torch.from_numpy(masks)
    # Per-sample callers take the B images in turn (not one cache-hot image), as a Dataset would.
    ones = [x[i].clone() for i in range(b)]  # MONAI: channel-first (1,H,W)
    ones4 = [x[i, :, :, :, None].clone() for i in range(b)]  # TorchIO: (1,H,W,1), a one-voxel-deep volume
    works = [imgs[i].copy() for i in range(b)]
    turn = iter(range(1 << 62))
    xc, mc = (x.cuda(), m.cuda()) if cuda else (None, None)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(
        f"# {args.modality}: {size}x{size} grey, torch batch B={b}, {torch.get_num_threads()} torch threads, "
        f"medians of {repeats} rounds; MONAI / TorchIO per sample; {'CUDA' if cuda else 'no CUDA'}"
    )
    results.notes |= {"batch": b, "size": size, "repeats": repeats}
    cols = ["numpy", "monai", "tio", "torch", "t/monai", "t/tio"] + (["cuda"] if cuda else [])
    widths, fmts = [9] * 6 + [10], [RATE] * 4 + [RATIO] * 2 + [RATE]
    print(f"{'perturbation':<15}" + "".join(c.rjust(w) for c, w in zip(cols, widths)))
    rows = []
    for label, pert, monai_f, tio_f in grey_cases(args.modality):
        if args.only and label not in args.only:
            continue
        rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)

        def nxt() -> int:
            return next(turn) % b

        fns: dict[str, tuple[Callable[[], object], int, Callable[[], None]]] = {
            "numpy": (lambda: pert.apply_numpy(works[(i := nxt())], masks[i], rng=rng), 1, lambda: None),
            "torch": (lambda: pert.apply_batch(x, m, generator=gen), b, lambda: None),
        }
        if monai_f is not None:
            mt = monai_f()
            fns["monai"] = (lambda: mt(ones[nxt()]), 1, lambda: None)
        if tio_f is not None:
            tt = tio_f()
            fns["tio"] = (lambda: tt(ones4[nxt()]), 1, lambda: None)
        if cuda:
            fns["cuda"] = (lambda: pert.apply_batch(xc, mc, generator=gen), b, sync)
        med = medians(fns, repeats, min_time)
        row = [med.get(k) for k in ("numpy", "monai", "tio", "torch")]
        row += [ratio(med, "torch", "monai"), ratio(med, "torch", "tio")]
        row += [med.get("cuda")] if cuda else []
        print(fixed_width(label, row, widths, fmts), flush=True)
        rows.append([label, *row])
    results.table(args.modality, ["perturbation", *cols], rows, dict(zip(cols, fmts)))


# --------------------------------------------------------------------------------------
# the Albumentations adapter vs the bare kernel (issue 19.3)
# --------------------------------------------------------------------------------------
ADAPTER_MAX_OVERHEAD = 0.15  # target: the adapter costs at most 15 % over apply_numpy
COLOUR_MIN_SPEEDUP = 2.0  # target: colour families through the adapter >= 2x Albumentations' equivalents


def colour_references() -> dict[str, tuple[str, A.BasicTransform]]:
    """The closest built-in Albumentations transform of each colour family (severity 3)."""
    return {
        "saturation": ("ColorJitter(sat)", A.ColorJitter(0, 0, (1.5, 1.5), 0, p=1.0)),
        "contrast": ("ColorJitter(b,c,s)", A.ColorJitter((0.7, 0.7), (0.7, 0.7), (0.7, 0.7), 0, p=1.0)),
        "white_balance": ("RGBShift", A.RGBShift((-60, -60), (0, 0), (-60, -60), p=1.0)),
    }


def _per_call(fn: Callable[[], object], calls: int) -> float:
    """µs of this thread's CPU time per call: everything runs on one thread, and CPU time, unlike wall time,
    does not count the slices the OS gives other processes on a shared machine."""
    t0 = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - t0) / calls * 1e6


def adapter_rounds(
    pert: P.Perturbation,
    t: A.BasicTransform,
    img: np.ndarray,
    mask: np.ndarray,
    ref: A.BasicTransform | None,
    repeats: int,
    min_time: float,
) -> dict[str, list[float]]:
    """Per round: µs/call of the bare kernel, the adapter and the reference, on the same param stream."""

    # np.random.default_rng(r) is what t.set_random_seed(r) gives t.random_generator, which the adapter draws
    # its params from: the bare calls on default_rng(r) sample the same params, call after call
    t.set_random_seed(0)
    first = t(image=img, mask=mask)["image"]
    if not np.array_equal(first, pert.apply_numpy(img, mask, rng=np.random.default_rng(0))[0]):
        raise SystemExit(f"{pert.name}: the adapter's output differs from apply_numpy's for the same seed")
    t0 = time.perf_counter()
    pert.apply_numpy(img, mask, rng=np.random.default_rng(1))
    calls = max(3, min(20000, int(min_time / max(time.perf_counter() - t0, 1e-6))))
    res: dict[str, list[float]] = {"bare": [], "adapter": [], "ref": []}
    for r in range(repeats):
        warm = np.random.default_rng(r)
        for _ in range(calls):  # untimed pass over the round's params: caches keyed by params (glyph
            pert.apply_numpy(
                img, mask, rng=warm
            )  # atlases, blur kernels) are warm for both, not only the second
        g = np.random.default_rng(r)
        runs = {
            "bare": lambda: pert.apply_numpy(img, mask, rng=g),
            "adapter": lambda: t(image=img, mask=mask),
        }
        if ref is not None:
            runs["ref"] = lambda: ref(image=img)
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]  # neither always runs first
        for k in order:
            if k == "adapter":
                t.set_random_seed(r)
            res[k].append(_per_call(runs[k], calls))
    return res


def main_adapter(args: argparse.Namespace, results: Results) -> None:
    from robusttrain.perturbations import albu as PA

    repeats = args.repeats or (3 if args.quick else 7)
    min_time = 0.1 if args.quick else 0.3
    sizes = [args.size] if args.size else [512, 128]
    cv2.setNumThreads(1)  # one thread everywhere (ours, Albumentations'): per-call costs, not core counts
    load0 = os.getloadavg()
    print(
        f"# Albumentations adapter vs bare kernel: opencv {cv2.__version__}, numpy {np.__version__}, "
        f"albumentations {A.__version__}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"cv2 threads {cv2.getNumThreads()}, {os.cpu_count()} CPUs; load average (1/5/15 min) at start "
        f"{load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; medians of {repeats} rounds, >= {min_time} s per figure"
    )
    print(
        "# us = CPU time per call (one thread); bare = apply_numpy(image, mask, rng); adapter = "
        "t(image=..., mask=...) on the same params; overhead = median per-round adapter/bare - 1"
    )
    refs = colour_references()
    misses: list[str] = []
    cols = [
        "family",
        "ch",
        "bare us",
        "adapter us",
        "overhead",
        "albumentations ref",
        "ref us",
        "adapter x ref",
    ]
    fmts = {"bare us": "{:.1f}", "adapter us": "{:.1f}", "overhead": "{:+.1%}", "ref us": "{:.1f}"}
    fmts["adapter x ref"] = RATIO
    results.notes |= {"repeats": repeats, "min_time_s": min_time, "load_start": list(load0)}
    results.notes |= {"opencv": cv2.__version__, "numpy": np.__version__, "albumentations": A.__version__}
    for size in sizes:
        rgb, mask64 = frame(size)
        mask = mask64.astype(np.uint8)
        grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)[:, :, None]
        noop = A.NoOp(p=1.0)
        call = statistics.median(_per_call(lambda: noop(image=rgb, mask=mask), 20000) for _ in range(3))
        print(
            f"\n## {size}x{size}: Albumentations' own cost of a call, in a tight loop (A.NoOp, image+mask): "
            f"{call:.1f} us"
        )
        results.notes[f"noop_call_us_{size}"] = call
        rows = []
        print(
            f"{'family':<15}{'ch':>3}{'bare us':>10}{'adapter us':>12}{'overhead':>10}  "
            f"{'albumentations ref':<20}{'ref us':>9}{'adapter x ref':>14}"
        )
        for family in PA.TRANSFORMS:
            if args.only and family not in args.only:
                continue
            pert = P.get(family, 3)
            img = rgb if family in P.available(channels=3) else grey
            name, ref = refs.get(family, ("-", None))
            res = adapter_rounds(pert, PA.transform_for(pert), img, mask, ref, repeats, min_time)
            bare, ad = statistics.median(res["bare"]), statistics.median(res["adapter"])
            over = statistics.median(a / b for a, b in zip(res["adapter"], res["bare"])) - 1
            flag = "" if over <= ADAPTER_MAX_OVERHEAD else " >15%"
            line = f"{family:<15}{img.shape[2]:>3}{bare:>10.1f}{ad:>12.1f}{over:>+9.1%}{flag:<5}  {name:<20}"
            refus = speed = None
            if ref is not None:
                refus = statistics.median(res["ref"])
                speed = statistics.median(r / a for r, a in zip(res["ref"], res["adapter"]))
                line += f"{refus:>9.1f}{speed:>13.2f}x" + ("" if speed >= COLOUR_MIN_SPEEDUP else " <2x")
                if speed < COLOUR_MIN_SPEEDUP:
                    misses.append(f"{family}@{size}: {speed:.2f}x Albumentations")
            if over > ADAPTER_MAX_OVERHEAD:
                misses.append(f"{family}@{size}: {over:+.1%}")
            print(line, flush=True)
            rows.append([family, img.shape[2], bare, ad, over, None if ref is None else name, refus, speed])
        results.table(f"adapter {size}x{size}", cols, rows, fmts)
    load1 = os.getloadavg()
    print(f"\n# load average at end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    results.notes |= {"load_end": list(load1), "targets_missed": misses}
    print(
        f"# targets (overhead <= {ADAPTER_MAX_OVERHEAD:.0%}, colour >= {COLOUR_MIN_SPEEDUP:.0f}x Albumentations): "
        + ("all met" if not misses else f"{len(misses)} missed: " + "; ".join(misses))
    )


if __name__ == "__main__":
    main()
