"""Calibration table of the perturbation families: how strong is each severity, at each image size?

For every modality with real frames under ``../shared/data`` (endoscopy: Kvasir-SEG + CVC-ClinicDB,
MRI: ACDC slices, X-ray: Shenzhen), every family of that modality's suite (plus ``motion_blur`` for
endoscopy), severity 1..5 and image size {128, 256, 512}, it prints the mean over a few frames of

* ``SSIM`` to the original (grey level, Gaussian window sigma 1.5, Wang et al. 2004),
* ``PSNR`` to the original (dB; capped at 99 when nothing changed),
* ``chg%`` the fraction of pixels changed by more than 2 grey levels in some channel,

and checks the calibration rules: SSIM falls and chg% rises with severity (``mono``, same seed at every
severity), severity 1 is visible (``vis1``: changes >= 0.1 % of the pixels — a localised artifact such as
a few highlights or a text line — or lowers SSIM by >= 0.01). With ``--downsize`` it also
prints the resolution-independence ratios of issue 11 §1 (mean |down(P(x_512)) - P(down(x_512))|
over the mean effect, at 128 and 256 px).

Run: ``python -m benchmarks.perf.calibration [--frames 2] [--sizes 128 256 512] [--markdown] [--downsize]
[--json PATH]`` (about a minute on 2 cores with the defaults). No timing: the figures depend on the code, the
frames and the seed, not on the machine's load; the run header still says at which commit they were taken.
"""

from __future__ import annotations

import argparse
import sys
import time

import cv2
import numpy as np

import robusttrain.perturbations as P
from benchmarks.common import Results, add_json_argument, imread
from benchmarks.paths import DATA_ROOT
from robusttrain.perturbations.suites import SUITES

DATA = DATA_ROOT  # $DATA_ROOT, else <repo>/../shared/data
CHANGED = 2  # grey levels: beyond rounding and the two paths' parity tolerance
# families measured with a modality's suite besides its own: the held-out and shift families are RGB endoscopy
EXTRA = {"endoscopy": ("motion_blur",) + SUITES["endoscopy_heldout"][1:] + SUITES["shift"]}


# ---------------------------------------------------------------------------------------- frames
def endoscopy_frames(n: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
    out = []
    for sub, pat, k in (("kvasir_seg", "*.jpg", (n + 1) // 2), ("cvc_clinicdb", "*.png", n // 2)):
        for f in sorted((DATA / sub / "images").glob(pat))[:k]:
            m = cv2.imread(str(DATA / sub / "masks" / f.name), cv2.IMREAD_GRAYSCALE)
            out.append((imread(f)[:, :, ::-1].copy(), None if m is None else (m > 127).astype(np.uint8)))
    return out


def mri_frames(n: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
    import h5py

    out = []
    for f in sorted((DATA / "acdc" / "volumes").glob("*.h5"))[:n]:
        with h5py.File(f, "r") as h:
            img, lab = np.asarray(h["image"]), np.asarray(h["label"])
        k = img.shape[0] // 2  # a mid-ventricular slice
        s = img[k]
        s = (np.clip((s - s.min()) / max(float(np.percentile(s, 99.5) - s.min()), 1e-6), 0, 1) * 255).astype(
            np.uint8
        )
        out.append((s[:, :, None], lab[k].astype(np.uint8)))
    return out


def xray_frames(n: int) -> list[tuple[np.ndarray, np.ndarray | None]]:
    out = []
    for f in sorted((DATA / "shenzhen_cxr" / "images").glob("*"))[:n]:
        img = imread(f, cv2.IMREAD_GRAYSCALE)
        masks = sorted((DATA / "shenzhen_cxr" / "masks").glob(f.stem + "*"))
        m = cv2.imread(str(masks[0]), cv2.IMREAD_GRAYSCALE) if masks else None
        out.append((img[:, :, None], None if m is None else (m > 127).astype(np.uint8)))
    return out


LOADERS = {"endoscopy": endoscopy_frames, "mri": mri_frames, "xray": xray_frames}


def resize(img: np.ndarray, mask: np.ndarray | None, size: int):
    r = cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA)
    r = r[:, :, None] if r.ndim == 2 else r
    m = (
        None
        if mask is None
        else cv2.resize(mask, (size, size), interpolation=cv2.INTER_NEAREST).astype(np.int64)
    )
    return np.ascontiguousarray(r), m


# ---------------------------------------------------------------------------------------- metrics
def grey(img: np.ndarray) -> np.ndarray:
    f = img.astype(np.float64)
    return f[:, :, 0] if f.shape[2] == 1 else f @ np.array([0.299, 0.587, 0.114])


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two uint8 images on their grey level (Gaussian window sigma 1.5, K1 .01, K2 .03)."""
    x, y = grey(a), grey(b)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    blur = lambda t: cv2.GaussianBlur(t, (11, 11), 1.5, borderType=cv2.BORDER_REFLECT)  # noqa: E731
    mx, my = blur(x), blur(y)
    sxx, syy, sxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return float(s.mean())


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else min(99.0, 10 * np.log10(255.0**2 / mse))


def changed(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=2) > CHANGED).mean())


# ---------------------------------------------------------------------------------------- tables
def measure(frames, names, sizes, seed: int = 0) -> dict:
    res: dict = {}
    for name in names:
        for sev in range(1, 6):
            op = P.get(name, severity=sev)
            for size in sizes:
                vals = []
                for i, (img, mask) in enumerate(frames):
                    x, m = resize(img, mask, size)
                    # the same seed at every severity: same cast / positions, only the strength differs
                    out, _ = op.apply_numpy(x, m, rng=np.random.default_rng(seed + 1000 * i))
                    out = out[:, :, None] if out.ndim == 2 else out
                    vals.append((ssim(x, out), psnr(x, out), changed(x, out)))
                res[(name, sev, size)] = np.mean(vals, 0)
    return res


def downsize_ratios(frames, names, seed: int = 0) -> dict:
    out: dict = {}
    for name in names:
        for sev in range(1, 6):
            op = P.get(name, severity=sev)
            acc = {128: [0.0, 0.0], 256: [0.0, 0.0]}
            for i, (img, mask) in enumerate(frames):
                x, m = resize(img, mask, 512)
                big, _ = op.apply_numpy(x, m, rng=np.random.default_rng(seed + i))
                for size in acc:
                    xs, ms = resize(x, None if m is None else m.astype(np.uint8), size)
                    ref = cv2.resize(big, (size, size), interpolation=cv2.INTER_AREA).astype(np.float32)
                    ref = ref[:, :, None] if ref.ndim == 2 else ref
                    o, _ = op.apply_numpy(xs, ms, rng=np.random.default_rng(seed + i))
                    o = o[:, :, None] if o.ndim == 2 else o
                    acc[size][0] += float(np.abs(ref - o).mean())
                    acc[size][1] += float(np.abs(ref - xs).mean())
            out[(name, sev)] = {s: d / max(e, 1e-9) for s, (d, e) in acc.items()}
    return out


def checks(res: dict, name: str, sizes) -> tuple[str, str]:
    mono, vis = [], []
    for size in sizes:
        s = [res[(name, v, size)][0] for v in range(1, 6)]
        c = [res[(name, v, size)][2] for v in range(1, 6)]
        ok = all(a >= b - 1e-3 for a, b in zip(s, s[1:])) and all(a <= b + 1e-3 for a, b in zip(c, c[1:]))
        mono.append("y" if ok else "N")
        vis.append("y" if (c[0] >= 0.001 or s[0] <= 0.99) else "N")
    return "".join(mono), "".join(vis)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=2, help="frames per modality (default 2)")
    ap.add_argument("--sizes", type=int, nargs="*", default=[128, 256, 512])
    ap.add_argument("--modalities", nargs="*", default=list(LOADERS))
    ap.add_argument(
        "--markdown", action="store_true", help="print markdown tables (for docs/perturbations.md)"
    )
    ap.add_argument("--downsize", action="store_true", help="also print the downsize-consistency ratios")
    add_json_argument(ap)
    args = ap.parse_args(argv)
    if not DATA.is_dir():
        sys.exit(f"no shared data at {DATA}: the calibration needs real frames")
    results = Results("benchmarks.perf.calibration", args, argv=argv)
    print(results.header_line())
    t0 = time.perf_counter()
    for mod in args.modalities:
        if mod not in LOADERS:
            sys.exit(f"unknown modality {mod!r}; valid: {', '.join(LOADERS)}")
        frames = LOADERS[mod](args.frames)
        if not frames:
            print(f"# {mod}: no frames found under {DATA}, skipped")
            continue
        names = [n for n in SUITES[mod] + EXTRA.get(mod, ()) if n in P.available()]
        res = measure(frames, names, args.sizes)
        results.notes[f"{mod}_frames"] = len(frames)
        head = ["family", "sev"] + [f"{m}@{s}" for s in args.sizes for m in ("SSIM", "PSNR", "chg%")]
        print(
            f"\n## {mod} ({len(frames)} frames; SSIM / PSNR dB / % pixels changed > {CHANGED} grey levels)\n"
        )
        if args.markdown:
            print("| " + " | ".join(head) + " |")
            print("|" + "---|" * len(head))
        else:
            print(f"{'family':<14}{'sev':>4}" + "".join(f"{h:>10}" for h in head[2:]))
        rows, flags = [], []
        for name in names:
            mono, vis = checks(res, name, args.sizes)
            flags.append([name, mono, vis])
            for sev in range(1, 6):
                cells, raw = [], []
                for size in args.sizes:
                    s, p, c = res[(name, sev, size)]
                    cells += [f"{s:.3f}", f"{p:.1f}", f"{100 * c:.1f}"]
                    raw += [float(s), float(p), 100 * float(c)]
                rows.append([name, sev, *raw])
                label = name if sev == 1 else ""
                if args.markdown:
                    print("| " + " | ".join([label, str(sev)] + cells) + " |")
                else:
                    print(f"{label:<14}{sev:>4}" + "".join(f"{c:>10}" for c in cells))
            flag = f"# {name}: monotone per size {mono} ({'/'.join(map(str, args.sizes))}), severity 1 visible {vis}"
            print(flag if not args.markdown else f"| {flag[2:]} |" + " |" * (len(head) - 1))
        # the JSON names the family on every row (the printed tables on its first); the checks apart
        fmts = {h: "{:.3f}" if h.startswith("SSIM") else "{:.1f}" for h in head[2:]}
        results.table(mod, head, rows, fmts)
        sizes = "/".join(map(str, args.sizes))
        results.table(
            f"{mod} checks", ["family", f"monotone per size ({sizes})", "severity 1 visible"], flags
        )
        if args.downsize:
            ratios = downsize_ratios(frames, names)
            print(f"\n## {mod}: mean |down(P(x_512)) - P(down(x_512))| / mean effect (target <= 0.3)\n")
            print(
                ("| family | " + " | ".join(f"s{v}@128 | s{v}@256" for v in range(1, 6)) + " |")
                if args.markdown
                else f"{'family':<14}" + "".join(f"{f's{v}@128':>9}{f's{v}@256':>9}" for v in range(1, 6))
            )
            if args.markdown:
                print("|" + "---|" * 11)
            down = [f"s{v}@{s}" for v in range(1, 6) for s in (128, 256)]
            results.table(
                f"{mod} downsize",
                ["family", *down],
                [[name] + [ratios[(name, v)][s] for v in range(1, 6) for s in (128, 256)] for name in names],
                {c: "{:.2f}" for c in down},
            )
            for name in names:
                cells = [f"{ratios[(name, v)][s]:.2f}" for v in range(1, 6) for s in (128, 256)]
                print(
                    ("| " + name + " | " + " | ".join(cells) + " |")
                    if args.markdown
                    else f"{name:<14}" + "".join(f"{c:>9}" for c in cells)
                )
    print(f"\n# {time.perf_counter() - t0:.0f} s")
    results.notes["seconds"] = time.perf_counter() - t0
    results.write(args.json)


if __name__ == "__main__":
    main()
