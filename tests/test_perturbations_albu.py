"""Albumentations integration, user cut-out folders (real EAD2019 instrument mask) and the gallery."""

from __future__ import annotations

import inspect
import json
import pickle
import typing
from pathlib import Path

import albumentations as A
import cv2
import numpy as np
import pytest

import robusttrain.perturbations as P
from robusttrain.perturbations import albu, get
from robusttrain.perturbations.cutouts import SIZE, load_cutouts
from robusttrain.perturbations.gallery import render_gallery

EAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "ead2019_artefacts"


GREY_ONLY = set(P.available()) - set(P.available(channels=3))  # MRI / X-ray families


def _img(h=96, w=96, seed=0, family=None):
    """A textured RGB frame, or its first channel as (H,W,1) for the single-channel families."""
    if family in GREY_ONLY:
        return _img(h, w, seed)[:, :, :1].copy()
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    img = np.stack([170 + 40 * np.sin(xx / 8), 90 + 30 * np.cos(yy / 6), 70 + 0 * xx], -1) + rng.normal(
        0, 5, (h, w, 3)
    )
    return np.clip(img, 0, 255).astype(np.uint8)


def _mask(h=96, w=96):
    m = np.zeros((h, w), np.uint8)
    m[40:60, 40:60] = 1
    return m


def _cutout_folder(folder: Path) -> Path:
    """One image + a 3-channel mask whose channels hold different shapes (so ``mask_channel`` matters)."""
    folder.mkdir(exist_ok=True)
    cv2.imwrite(str(folder / "a.jpg"), np.full((60, 80, 3), (40, 180, 90), np.uint8))
    mask = np.zeros((60, 80, 3), np.uint8)
    mask[20:40, 10:30, 0] = 255
    ch1 = np.zeros((60, 80), np.uint8)
    cv2.ellipse(ch1, (40, 30), (35, 20), 0, 0, 360, 255, -1)
    mask[:, :, 1] = mask[:, :, 2] = ch1
    cv2.imwrite(str(folder / "a_mask.png"), mask)
    return folder


# Arguments whose non-default value cannot be derived from the default's type (keyed by argument name,
# or by (family, argument)); a function of a scratch folder, returning the kwargs to pass.
SPECIAL = {
    "cast": lambda tmp: {"cast": "green"},
    "n_procedural": lambda tmp: {"n_procedural": 3},
    "cutouts": lambda tmp: {"cutouts": str(_cutout_folder(tmp / "cuts"))},
    "mask_channel": lambda tmp: {"mask_channel": 1, "cutouts": str(_cutout_folder(tmp / "cuts"))},
}


def _family_args(family):
    return [q for q in list(inspect.signature(P.family_class(family).__init__).parameters.values())[1:]]


def _non_default(family, q, tmp):
    """kwargs giving argument ``q`` of ``family`` a value other than its default."""
    key = (family, q.name) if (family, q.name) in SPECIAL else q.name
    if key in SPECIAL:
        return SPECIAL[key](tmp)
    d = q.default
    hint = typing.get_type_hints(P.family_class(family).__init__).get(q.name)
    if typing.get_origin(hint) is typing.Literal:
        return {q.name: next(c for c in typing.get_args(hint) if c != d)}
    if q.name == "severity":
        return {"severity": 5 if d != 5 else 1}
    if isinstance(d, bool):
        return {q.name: not d}
    if isinstance(d, int):
        return {q.name: d + 1}
    if isinstance(d, float):
        return {q.name: d / 2 if d else 0.5}
    pytest.fail(f"no non-default test value for {family}.{q.name} (default {d!r}): add one to SPECIAL")


CASES = [(f, q.name) for f in sorted(albu.TRANSFORMS) for q in _family_args(f)]


@pytest.mark.parametrize(("family", "arg"), CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_every_argument_round_trips_through_to_dict_from_dict(family, arg, tmp_path):
    q = next(q for q in _family_args(family) if q.name == arg)
    kw = _non_default(family, q, tmp_path)
    cls = albu.TRANSFORMS[family]
    assert arg in cls.get_transform_init_args_names(cls)
    expected = get(family, **kw).init_args()  # what the family itself records
    assert expected[arg] == kw[arg] and expected[arg] != q.default
    t = cls(**kw, p=0.8)
    d = json.loads(json.dumps(A.to_dict(A.Compose([t]))))  # through real JSON, as a saved pipeline is
    back = A.from_dict(d).transforms[0]
    assert type(back) is cls and back.p == 0.8
    assert back.family_args == t.family_args == {**expected}
    assert back.perturbation.init_args() == expected  # the argument reached the perturbation
    # existing perturbation objects keep every argument too
    assert albu.transform_for(get(family, **kw)).family_args == expected
    img, m = _img(family=family), _mask()
    out = A.Compose([cls(**kw)], seed=5)(image=img, mask=m)["image"]
    again = A.Compose([back], seed=5)(image=img, mask=m)["image"]
    assert np.array_equal(out, again)


def test_issue_examples_keep_their_arguments():
    """The three arguments the issue reported as lost after to_dict/from_dict now act after the round trip."""
    img, m = _img(), _mask()
    pipe = A.Compose(
        [
            albu.BlurTransform(noise=False),
            albu.InstrumentTransform(n_procedural=3),
            albu.WhiteBalanceTransform(cast="green", severity=5),
        ]
    )
    blur, inst, wb = A.from_dict(A.to_dict(pipe)).transforms
    assert inst.perturbation.bank.shape[0] == 3
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert blur.perturbation.sample_numpy(img, m, rng)["noise"] == 0
        assert wb.perturbation.sample_numpy(img, m, rng)["cast"] == 0  # CASTS[0] == "green"
    out = A.Compose([wb], seed=0)(image=img)["image"].astype(int)
    assert (out[..., 1] - img[..., 1].astype(int)).mean() > (out[..., 0] - img[..., 0].astype(int)).mean()


def test_every_family_has_a_transform_except_those_needing_a_model():
    need_model = {f for f in P.available() if any(q.name == "model" for q in _family_args(f))}
    assert set(albu.TRANSFORMS) == set(P.available()) - need_model and "adversarial" in need_model
    for _f, cls in albu.TRANSFORMS.items():
        assert getattr(albu, cls.__name__) is cls and cls.__module__ == albu.__name__
    assert albu.TRANSFORMS["white_balance"] is albu.WhiteBalanceTransform  # the old public names still work
    assert albu.transform_class("motion_blur").__name__ == "MotionBlurTransform"


def test_transform_classes_are_declared_statically_for_exactly_the_registry():
    """IDEs and type checkers read the source: every family's class must be a module-level class statement."""
    import ast

    tree = ast.parse(Path(albu.__file__).read_text())
    declared = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and [b.id for b in node.bases if isinstance(b, ast.Name)] == [
            "PerturbationTransform"
        ]:
            fam = [
                st.value.value
                for st in node.body
                if isinstance(st, ast.Assign)
                and [t.id for t in st.targets if isinstance(t, ast.Name)] == ["family"]
            ]
            declared[node.name] = fam[0] if fam else None
    need_model = {f for f in P.available() if any(q.name == "model" for q in _family_args(f))}
    assert declared == {albu._class_name(f): f for f in P.available() if f not in need_model}
    assert list(declared.values()) == [f for f in P.available() if f not in need_model]  # registry order
    static_all = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__all__"]
    )
    assert set(ast.literal_eval(static_all)) == {
        *declared,
        "PerturbationTransform",
        "TRANSFORMS",
        "transform_class",
        "transform_for",
    }
    assert "globals()" not in Path(albu.__file__).read_text()
    with pytest.raises(TypeError, match="must be called BlurTransform"):
        type("Blurry", (albu.PerturbationTransform,), {"family": "blur", "__module__": __name__})


@pytest.mark.parametrize("family", sorted(albu.TRANSFORMS))
def test_each_family_in_compose_uint8_and_float_replay_and_pickle(family):
    img, m = _img(family=family), _mask()
    t = A.Compose([albu.TRANSFORMS[family](severity=4, p=1.0)], seed=3)
    out = t(image=img, mask=m)
    assert out["image"].dtype == np.uint8 and out["image"].shape == img.shape
    assert np.array_equal(out["mask"], m)
    if family in ("specularity", "instrument", "feces", "blood", "text", "melt"):
        assert np.array_equal(out["image"][m != 0], img[m != 0])  # the lesion is left alone
    else:
        assert not np.array_equal(out["image"], img)
    f = t(image=img.astype(np.float32) / 255, mask=m)["image"]
    assert f.dtype == np.float32 and f.min() >= 0 and f.max() <= 1
    r = A.ReplayCompose([albu.TRANSFORMS[family](severity=4)])
    r.set_random_seed(1)
    first = r(image=img, mask=m)
    assert np.array_equal(A.ReplayCompose.replay(first["replay"], image=img, mask=m)["image"], first["image"])
    clone = pickle.loads(pickle.dumps(t))  # data-loader workers started with spawn pickle the pipeline
    assert np.array_equal(A.Compose(clone.transforms, seed=3)(image=img, mask=m)["image"], out["image"])


def _call_variants(family):
    img = _img(family=family)
    grey = family in GREY_ONLY
    return {
        "uint8": (img, _mask()),
        "float32": (img.astype(np.float32) / 255, _mask()),
        "2-D grey / (H,W,1) mask": (img[:, :, 0], _mask()[:, :, None])
        if grey
        else (img, _mask()[:, :, None]),
        "strided image and mask, no mask key": (np.asfortranarray(img), None),
        "strided mask": (img, np.asfortranarray(np.tile(_mask()[:, :, None], (1, 1, 2)))[:, :, 0]),
    }


@pytest.mark.parametrize("family", sorted(albu.TRANSFORMS))
def test_short_call_path_matches_albumentations_generic_call(family):
    """PerturbationTransform.__call__'s short path gives what BasicTransform.__call__ gives: image, mask,
    contiguity, self.params, and the generator's position afterwards (checked by a second call)."""
    fast, generic = albu.TRANSFORMS[family](severity=4), albu.TRANSFORMS[family](severity=4)
    for name, (img, mask) in _call_variants(family).items():
        data = {"image": img} if mask is None else {"image": img, "mask": mask}
        for t in (fast, generic):
            t.set_random_seed(7)
        for _ in range(2):
            a = fast(**data)
            b = A.DualTransform.__call__(generic, **data)
            assert a.keys() == b.keys() == data.keys(), name
            for k in a:
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (name, k)
                assert a[k].flags.c_contiguous and b[k].flags.c_contiguous, (name, k)
            assert fast.params.keys() == generic.params.keys() == {"shape", "perturbation_params", "lesion"}
            assert fast.params["shape"] == generic.params["shape"] == img.shape
            pa, pb = fast.params["perturbation_params"], generic.params["perturbation_params"]
            assert pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa), name
    # p < 1: the same py_random draws decide, and a skipped call leaves the data alone with empty params
    fast, generic = albu.TRANSFORMS[family](severity=4, p=0.5), albu.TRANSFORMS[family](severity=4, p=0.5)
    img, mask = _img(family=family), _mask()
    for t in (fast, generic):
        t.set_random_seed(3)
    applied = []
    for _ in range(8):
        a, b = fast(image=img, mask=mask), A.DualTransform.__call__(generic, image=img, mask=mask)
        assert np.array_equal(a["image"], b["image"]) and bool(fast.params) == bool(generic.params)
        applied.append(bool(fast.params))
        if not fast.params:
            assert a["image"] is img
    assert any(applied) and not all(applied)
    assert np.array_equal(
        fast(image=img, force_apply=True)["image"], generic(image=img, force_apply=True)["image"]
    )


def test_compose_seed_gives_the_same_images_and_params_come_from_the_transforms_generator():
    """Same Compose seed -> same images (within a version); each transform draws its params straight from the
    generator Albumentations gives it (``Compose(seed=s)`` seeds every transform's with ``s``)."""
    img, m = _img(), _mask()

    def run(seed):
        pipe = A.Compose([albu.SaturationTransform(severity=3), albu.BlurTransform(severity=2)], seed=seed)
        return [pipe(image=img, mask=m)["image"] for _ in range(3)]

    first, again, other = run(4), run(4), run(5)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], other[0])
    ref = get("saturation", severity=3).apply_numpy(img, m, rng=np.random.default_rng(4))[0]
    ref = get("blur", severity=2).apply_numpy(ref, m, rng=np.random.default_rng(4))[0]
    assert np.array_equal(first[0], ref)


def test_replaycompose_replays_exactly_and_mixes_with_builtins():
    img, m = _img(), _mask()
    r = A.ReplayCompose(
        [
            albu.SpecularityTransform(severity=5),
            A.HorizontalFlip(p=1.0),
            albu.BlurTransform(severity=2),
            albu.TextTransform(severity=3),
        ]
    )
    r.set_random_seed(0)
    out = r(image=img, mask=m)
    again = A.ReplayCompose.replay(out["replay"], image=img, mask=m)
    assert np.array_equal(out["image"], again["image"])
    assert np.array_equal(out["mask"], m[:, ::-1])  # only the flip touches the mask


def test_bad_arguments_rejected_at_construction():
    with pytest.raises(ValueError, match="severity must be an int in 1..5"):
        albu.BlurTransform(severity=9)
    with pytest.raises(ValueError, match="'sevrity' are not valid for transform BlurTransform"):
        albu.BlurTransform(sevrity=2)  # a typo is an error, not a warning that drops the argument
    with pytest.raises(ValueError, match="noise"):
        albu.BlurTransform(noise="sometimes")
    with pytest.raises(ValueError, match="cast must be one of"):
        albu.WhiteBalanceTransform(cast="blue")
    with pytest.raises(ValueError, match="no Albumentations transform"):
        albu.transform_for(get("adversarial", model=lambda x: x))
    with pytest.raises(TypeError, match="abstract"):
        albu.PerturbationTransform()


def test_transform_for_reuses_configuration():
    t = albu.transform_for(get("white_balance", severity=2, cast="purple"), p=1.0)
    assert isinstance(t, albu.WhiteBalanceTransform) and t.family_args == {"severity": 2, "cast": "purple"}
    d = A.to_dict(A.Compose([t]))
    assert A.from_dict(d).transforms[0].perturbation.cast == "purple"


@pytest.mark.shared_data
@pytest.mark.skipif(not EAD.is_dir(), reason="../shared/data/ead2019_artefacts not present")
def test_real_instrument_cutout_from_ead2019_folder():
    cuts = load_cutouts(EAD, mask_channel=0)  # images/ + masks/*_mask.tif (5-channel TIFF)
    assert len(cuts) == 1 and cuts[0].shape == (SIZE, SIZE, 4)
    assert 0.1 < cuts[0][:, :, 3].mean() < 0.9
    p = get("instrument", severity=4, cutouts=EAD)
    img, m = _img(256, 256), np.zeros((256, 256), np.int64)
    m[100:140, 100:140] = 1
    out, params = p.apply_numpy(img, m, rng=np.random.default_rng(0))
    assert params["visible"] == 1 and (out != img).any()
    assert np.array_equal(out[m != 0], img[m != 0])
    t = A.Compose([albu.InstrumentTransform(severity=3, cutouts=EAD)], seed=0)
    assert A.from_dict(A.to_dict(t)).transforms[0].perturbation.cutouts == str(EAD)


def test_user_folder_rgba_and_pairs(tmp_path):
    rgba = np.zeros((40, 60, 4), np.uint8)
    rgba[10:30, 10:50] = (40, 200, 90, 255)
    cv2.imwrite(str(tmp_path / "a.png"), rgba)
    img = np.full((50, 50, 3), 128, np.uint8)
    mask = np.zeros((50, 50), np.uint8)
    mask[5:45, 20:30] = 255
    cv2.imwrite(str(tmp_path / "b.jpg"), img)
    cv2.imwrite(str(tmp_path / "b_mask.png"), mask)
    cv2.imwrite(str(tmp_path / "c.jpg"), img)  # no mask: ignored
    cuts = load_cutouts(tmp_path)
    assert len(cuts) == 2
    assert cuts[0][SIZE // 2, SIZE // 2, 3] > 0.9  # object centred, opaque
    assert abs(cuts[0][SIZE // 2, SIZE // 2, 1] - 200 / 255) < 0.02  # RGB order (BGR file read correctly)


def test_empty_or_missing_cutout_folder_errors(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="no usable files; expected RGBA PNGs"):
        get("feces", cutouts=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        get("blood", cutouts=tmp_path / "nope")


def test_gallery_grid(tmp_path):
    imgs = [_img(80, 80, 0), _img(80, 80, 1)]
    path = render_gallery(
        imgs, tmp_path / "g.png", names=["blur", "text", "instrument"], severities=(1, 3, 5), tile=64
    )
    grid = cv2.imread(str(path))
    assert grid.shape == (2 * 3 * 64, 4 * 64, 3)
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, no temp left
    with pytest.raises(ValueError, match="HWC uint8 RGB"):
        render_gallery([np.zeros((8, 8), np.float32)], tmp_path / "bad.png")
    assert set(P.available()) >= {"blur", "text", "instrument"}
