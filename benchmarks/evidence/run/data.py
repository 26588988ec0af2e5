"""The evidence runner's data: each data set's train / validation / held-out split, fixed by
``--data-seed`` (every key -- case, patient, video sequence -- on one side)."""

from __future__ import annotations

import csv
from pathlib import Path

from benchmarks.paths import DATA_ROOT

DATA = DATA_ROOT  # $DATA_ROOT, else <repo>/../shared/data; --data-root overrides

# (held-out test, validation) share of each dataset's keys, the protocol's split (--test/--val-fraction)
SPLIT_FRACTIONS = {
    "synthetic": (0.25, 0.25),
    "polyp": (0.25, 0.15),
    "acdc": (0.3, 0.3),
    "polyp256": (0.15, 0.1),
    "pranet256": (0.15, 0.1),
}


def three_way_indices(keys: list[str], test_fraction: float, val_fraction: float, seed: int):
    """(train, val, test) sample indices; every key (case, patient, video sequence) on one side:
    ``test_fraction`` of all keys is held out, then ``val_fraction`` of all keys from the rest."""
    from robusttrain.datamodules.base import split_by_case

    rest, test = split_by_case(keys, test_fraction, seed)
    rest_keys = [keys[i] for i in rest]
    tr, va = split_by_case(rest_keys, val_fraction / (1.0 - test_fraction), seed + 1)
    tr, va = [rest[i] for i in tr], [rest[i] for i in va]
    assert not ({keys[i] for i in tr} & {keys[i] for i in va + test}), "split leaks a case"
    return tr, va, test


def three_way_split(dm, test_fraction: float, val_fraction: float, seed: int):
    """Set ``dm.train_dataset`` / ``dm.val_dataset`` and return the held-out test view.

    Split by the datamodule's split key (case; ACDC: patient): ``test_fraction`` of all keys is
    held out, then ``val_fraction`` of all keys is taken from the rest for validation.
    """
    source = dm._read(dm.root)
    keys = [dm._split_key(source.case_id(i)) for i in range(len(source))]
    tr, va, test = three_way_indices(keys, test_fraction, val_fraction, seed)
    dm.train_dataset, dm.val_dataset = dm._view(source, tr, True), dm._view(source, va, False)
    return dm._view(source, test, False)


class ConcatSource:
    """Several sources as one (a datamodule source: ``load``, ``case_id``, ``slice_index``); case ids
    get the part's name as prefix (``kvasir-<id>``, ``clinicdb-<id>``), so they stay unique."""

    def __init__(self, parts: dict):
        self.parts = list(parts.items())
        self.index = [(k, i) for k, (_, src) in enumerate(self.parts) for i in range(len(src))]
        self.mask_mode = getattr(self.parts[0][1], "mask_mode", None)

    def __len__(self) -> int:
        return len(self.index)

    def load(self, i: int):
        k, j = self.index[i]
        return self.parts[k][1].load(j)

    def case_id(self, i: int) -> str:
        k, j = self.index[i]
        return f"{self.parts[k][0]}-{self.parts[k][1].case_id(j)}"

    def slice_index(self, i: int) -> int:
        return 0


def polypgen_by_centre(dm, root: Path) -> dict:
    """One held-out view per PolypGen centre (``centres.csv``; C1/C2/C4 are inferred, see PROVENANCE)."""
    source = dm._read(str(root))
    with open(root / "centres.csv", newline="") as f:
        centre = {Path(r["image"]).stem: r["centre_inferred"] for r in csv.DictReader(f)}
    out: dict[str, list[int]] = {}
    for i in range(len(source)):
        out.setdefault(f"polypgen_{centre[source.case_id(i)]}", []).append(i)
    return {name: dm._view(source, idx, False) for name, idx in sorted(out.items())}


def clinicdb_sequences(root: Path) -> dict[str, str]:
    """``{case id (file stem): "seqN"}`` from CVC-ClinicDB's ``sequences.csv`` (frames of one video
    sequence show one polyp: they are resampled together)."""
    with open(root / "sequences.csv", newline="") as f:
        return {Path(r["file"]).stem: f"seq{int(r['sequence']):02d}" for r in csv.DictReader(f)}


def build_polyp256(args, kw):
    """Evidence v3 data: Kvasir-SEG (998, polyp_256) split by file id into train / validation /
    held-out test; all 609 CVC-ClinicDB frames (clustered by sequence) and ColonDB, ETIS and the
    PolypGen centres held out. ``dm.clusters`` maps ``(set, case id)`` to its bootstrap cluster."""
    from robusttrain.datamodules.polyp import PolypDataModule

    data = Path(getattr(args, "data_root", None) or DATA)
    root = data / "polyp_256"
    dm = PolypDataModule(root=str(root / "kvasir_seg"), **kw)
    held = {"kvasir_test": three_way_split(dm, args.test_fraction, args.val_fraction, args.data_seed)}
    held["cvc_clinicdb"] = dm._view(dm._read(str(root / "cvc_clinicdb")), None, False)
    for name, folder in (("cvc_colondb", "cvc_colondb"), ("etis", "etis_larib")):
        held[name] = dm._view(dm._read(str(data / folder)), None, False)
    held.update(polypgen_by_centre(dm, data / "polypgen"))
    seqs = clinicdb_sequences(root / "cvc_clinicdb")
    dm.clusters = {("cvc_clinicdb", c): f"cvc_clinicdb/{seqs[c]}" for c in held["cvc_clinicdb"].case_ids()}
    return dm, held, ["kvasir_test"]


def build_pranet256(args, kw):
    """GPU protocol (PraNet-style): train on Kvasir-SEG **and** CVC-ClinicDB. Kvasir split by file
    id, ClinicDB by video sequence (``sequences.csv``), each into train / validation / test with
    ``--test-fraction`` / ``--val-fraction``; validation = both validation parts; held out: both test
    parts (``kvasir_test``, ``cvc_clinicdb`` = the held-out sequences), ColonDB, ETIS, PolypGen."""
    from robusttrain.datamodules.polyp import PolypDataModule

    root = Path(args.data_root) / "polyp_256"
    dm = PolypDataModule(root=str(root / "kvasir_seg"), **kw)
    src = ConcatSource(
        {"kvasir": dm._read(str(root / "kvasir_seg")), "clinicdb": dm._read(str(root / "cvc_clinicdb"))}
    )
    seqs = clinicdb_sequences(root / "cvc_clinicdb")
    ids = [src.case_id(i) for i in range(len(src))]
    parts = {
        "kvasir": [i for i, c in enumerate(ids) if c.startswith("kvasir-")],
        "clinicdb": [i for i, c in enumerate(ids) if c.startswith("clinicdb-")],
    }
    key = lambda c: f"clinicdb-{seqs[c.split('-', 1)[1]]}" if c.startswith("clinicdb-") else c
    split = {}
    for name, idx in parts.items():
        tr, va, te = three_way_indices(
            [key(ids[i]) for i in idx], args.test_fraction, args.val_fraction, args.data_seed
        )
        split[name] = ([idx[i] for i in tr], [idx[i] for i in va], [idx[i] for i in te])
    dm.train_dataset = dm._view(src, split["kvasir"][0] + split["clinicdb"][0], True)
    dm.val_dataset = dm._view(src, split["kvasir"][1] + split["clinicdb"][1], False)
    held = {
        "kvasir_test": dm._view(src, split["kvasir"][2], False),
        "cvc_clinicdb": dm._view(src, split["clinicdb"][2], False),
    }
    # The other OOD sets are optional here: the device copy (benchmarks/gpu/pack.py) carries them only
    # while its 64 MiB budget holds. A missing one is named, never silently dropped.
    for name, folder in (("cvc_colondb", "cvc_colondb"), ("etis", "etis_larib"), ("polypgen", "polypgen")):
        if not (Path(args.data_root) / folder).is_dir():
            print(f"[evidence] held-out set {folder} not under {args.data_root}: not reported", flush=True)
        elif name == "polypgen":
            held.update(polypgen_by_centre(dm, Path(args.data_root) / folder))
        else:
            held[name] = dm._view(dm._read(str(Path(args.data_root) / folder)), None, False)
    dm.clusters = {("cvc_clinicdb", c): f"cvc_clinicdb/{key(c)}" for c in held["cvc_clinicdb"].case_ids()}
    return dm, held, ["kvasir_test"]


# folders each data set reads under --data-root (checked before anything is created)
REQUIRED = {
    "synthetic": (),
    "polyp": ("kvasir_seg", "cvc_clinicdb", "cvc_colondb", "etis_larib", "polypgen"),
    "polyp256": ("polyp_256/kvasir_seg", "polyp_256/cvc_clinicdb", "cvc_colondb", "etis_larib", "polypgen"),
    "pranet256": ("polyp_256/kvasir_seg", "polyp_256/cvc_clinicdb"),
    "acdc": ("acdc/volumes",),
}
SYNTHETIC_CASES = (
    40  # Kvasir stand-in (train / val / test), plus 12 "ClinicDB" frames in 3 sequences and 4 others
)


def build_synthetic(args, kw):
    """Procedural polyp frames shaped like ``polyp256`` (for the tiny grid and the tests, no data folder):
    a three-way split of :data:`SYNTHETIC_CASES` frames, a ``cvc_clinicdb`` stand-in of 12 frames in
    3 "sequences" of 4 (bootstrap clusters) and an ``etis`` stand-in of 4 (``other_ood``)."""
    from robusttrain.datamodules.polyp import PolypDataModule
    from robusttrain.datamodules.synthetic_polyp import SyntheticPolypSource

    dm = PolypDataModule(**kw)
    n, size, s = SYNTHETIC_CASES, args.size, args.data_seed
    src = SyntheticPolypSource(n, seed=s, image_size=size)
    tr, va, te = three_way_indices(
        [src.case_id(i) for i in range(n)], args.test_fraction, args.val_fraction, s
    )
    dm.train_dataset, dm.val_dataset = dm._view(src, tr, True), dm._view(src, va, False)
    held = {"kvasir_test": dm._view(src, te, False)}
    held["cvc_clinicdb"] = dm._view(SyntheticPolypSource(12, s + 1, size, start=n), None, False)
    held["etis"] = dm._view(SyntheticPolypSource(4, s + 2, size, start=n + 12), None, False)
    ids = held["cvc_clinicdb"].case_ids()
    dm.clusters = {("cvc_clinicdb", c): f"cvc_clinicdb/seq{i // 4:02d}" for i, c in enumerate(ids)}
    return dm, held, ["kvasir_test"]


def build_data(args):
    """(datamodule with train/val set up, {held-out name: dataset}, in-domain names)."""
    kw = dict(image_size=args.size, batch_size=args.batch_size, seed=args.data_seed, num_workers=0)
    data = Path(getattr(args, "data_root", None) or DATA)
    if args.dataset == "synthetic":
        return build_synthetic(args, kw)
    if args.dataset == "polyp256":
        return build_polyp256(args, kw)
    if args.dataset == "pranet256":
        return build_pranet256(args, kw)
    if args.dataset == "polyp":
        from robusttrain.datamodules.polyp import PolypDataModule

        dm = PolypDataModule(root=str(data / "kvasir_seg"), **kw)
        held = {"kvasir_test": three_way_split(dm, args.test_fraction, args.val_fraction, args.data_seed)}
        for name, folder in (
            ("cvc_clinicdb", "cvc_clinicdb"),
            ("cvc_colondb", "cvc_colondb"),
            ("etis", "etis_larib"),
        ):
            held[name] = dm._view(dm._read(str(data / folder)), None, False)
        held.update(polypgen_by_centre(dm, data / "polypgen"))
        return dm, held, ["kvasir_test"]
    from robusttrain.datamodules.acdc import ACDCDataModule

    dm = ACDCDataModule(root=str(data / "acdc" / "volumes"), **kw)
    held = {"acdc_test": three_way_split(dm, args.test_fraction, args.val_fraction, args.data_seed)}
    return dm, held, ["acdc_test"]
