"""Pack the shared polyp data small enough to travel to the GPU device machine (see setup.sh).

The device tool sends the working tree plus carried folders, 64 MiB at most, so the data goes as a
compact copy in ``.gpudata/`` (git-ignored through ``.git/info/exclude``, never committed):

* ``polyp_256/{kvasir_seg,cvc_clinicdb}`` always, then ``cvc_colondb``, ``etis_larib``, ``polypgen``
  in that order while the budget (repository + ``.whl/`` + ``.gpudata/``) holds;
* images are the original bytes; each mask is thresholded with the reader's own ``binary255`` rule
  (channel maximum > 127) and re-encoded as a 1-bit PNG with the same stem (``<stem>.png``,
  ``<stem>_mask.png``), which the readers match by stem whatever the extension;
* a mask that is not clean 0/255 (the reader would refuse it or read it as class indices) is copied
  unchanged, so the copy reads exactly as the original would; every packed mask is decoded again
  and compared with the original's classes, and each folder's detected mask mode must match;
* side files (``sequences.csv``, ``centres.csv``, ``PROVENANCE.md``) are copied; ``PACKED.md`` says
  what was done. The copy is built beside ``.gpudata`` and swapped in at the end.

Read on the device with ``python -m robusttrain fit recipe=polyp data.root=.gpudata/polyp_256/kvasir_seg``.

Run: ``python -m benchmarks.gpu.pack [--src ../shared/data] [--dst .gpudata] [--budget-mib 60]``
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np

from robusttrain.datamodules.errors import DataError
from robusttrain.datamodules.masks import decode_mask
from robusttrain.datamodules.readers import FolderSource, find_pairs, read_mask, read_raw_mask

REPO = Path(__file__).resolve().parents[2]

REQUIRED = ("polyp_256/kvasir_seg", "polyp_256/cvc_clinicdb")
OPTIONAL = ("cvc_colondb", "etis_larib", "polypgen")
MIB = 2**20


def size_of(path: Path) -> int:
    """Bytes of the plain files under ``path`` (a file or a folder)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def repo_bytes() -> int:
    """Bytes of what the device tool sends besides carried folders: tracked + untracked-not-ignored files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True, capture_output=True
    ).stdout
    return sum(size_of(REPO / f) for f in out.decode().split("\0") if f)


def pack_mask(src: Path, dst_dir: Path) -> tuple[Path, bool]:
    """Write ``src`` as a 1-bit PNG in ``dst_dir`` (or copy it unchanged); (written path, re-encoded?)."""
    raw = read_raw_mask(src)
    try:
        classes = decode_mask(raw, "binary255", 2, src)
    except DataError:  # not clean 0/255: keep the bytes so the reader decides exactly as before
        return Path(shutil.copyfile(src, dst_dir / src.name)), False
    out = dst_dir / f"{src.stem}.png"
    if not cv2.imwrite(
        str(out), classes * np.uint8(255), [cv2.IMWRITE_PNG_BILEVEL, 1, cv2.IMWRITE_PNG_COMPRESSION, 9]
    ):
        raise OSError(f"cannot write {out}")
    if not np.array_equal(read_mask(out, "binary255"), classes):
        raise AssertionError(f"{out} does not read back as the classes of {src}")
    return out, True


def pack_set(src: Path, dst: Path) -> str:
    """Copy one image/mask folder from ``src`` to ``dst`` (module doc); a one-line summary."""
    pairs = find_pairs(src)
    for side in src.iterdir():  # sequences.csv, centres.csv, PROVENANCE.md
        if side.is_file():
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(side, dst / side.name)
    reencoded = 0
    for img, mask, _ in pairs:
        (dst / img.parent.name).mkdir(parents=True, exist_ok=True)
        (dst / mask.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(img, dst / img.parent.name / img.name)
        reencoded += pack_mask(mask, dst / mask.parent.name)[1]
    before, after = FolderSource(src, cache_mb=0), FolderSource(dst, cache_mb=0)
    if [p[2] for p in before.pairs] != [p[2] for p in after.pairs] or before.mask_mode != after.mask_mode:
        raise AssertionError(
            f"{dst} does not read like {src} (case ids or mask mode {after.mask_mode!r} differ)"
        )
    return f"{len(pairs)} pairs, {reencoded} masks re-encoded as 1-bit PNG, {size_of(dst) / MIB:.2f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--dst", type=Path, default=REPO / ".gpudata")
    ap.add_argument("--whl", type=Path, default=REPO / ".whl", help="wheels that travel too (counted)")
    ap.add_argument("--budget-mib", type=float, default=60.0, help="repository + wheels + data, at most")
    args = ap.parse_args()
    dst = args.dst.resolve()
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fixed = repo_bytes() + size_of(args.whl)
    lines = []
    for name in REQUIRED + OPTIONAL:
        if not (args.src / name).is_dir():
            lines.append(f"{name}: not found in {args.src}, skipped")
            continue
        lines.append(f"{name}: {pack_set(args.src / name, tmp / name)}")
        if name in OPTIONAL and fixed + size_of(tmp) > args.budget_mib * MIB:
            shutil.rmtree(tmp / name)
            lines[-1] = f"{name}: skipped, would pass the {args.budget_mib:g} MiB budget"
    if (args.src / "polyp_256" / "PROVENANCE.md").is_file():
        shutil.copyfile(args.src / "polyp_256" / "PROVENANCE.md", tmp / "polyp_256" / "PROVENANCE.md")
    total = fixed + size_of(tmp)
    if total > args.budget_mib * MIB:
        shutil.rmtree(tmp)
        sys.exit(
            f"pack.py: the required sets alone make {total / MIB:.1f} MiB > --budget-mib {args.budget_mib:g}"
        )
    (tmp / "PACKED.md").write_text(
        "# Compact copy of ../shared/data for the GPU device machine (benchmarks/gpu/pack.py)\n\n"
        "Images: original bytes. Masks: thresholded at channel max > 127 and saved as 1-bit PNG (same stem),\n"
        "except masks that are not clean 0/255, copied unchanged. Each set's PROVENANCE.md applies.\n\n"
        + "".join(f"- {line}\n" for line in lines)
    )
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)
    print("\n".join(lines))
    print(
        f"{dst}: {size_of(dst) / MIB:.2f} MiB; travelling in all (repo + {args.whl.name} + data): "
        f"{total / MIB:.2f} MiB of {args.budget_mib:g}"
    )


if __name__ == "__main__":
    main()
