"""Unit tests of robusttrain.metamorphic: scoring sums, EFR, the seeded suite, both paths, hooks."""

import numpy as np
import pandas as pd
import pytest
import torch

from robusttrain import perturbations as P
from robusttrain.metamorphic.batch import BatchHooks, HookError, iter_probe
from robusttrain.metamorphic.efr import ENDPOINT_COLUMNS, TABLE_COLUMNS, efr_metrics, efr_table, is_error
from robusttrain.metamorphic.runner import ProbeResult, aggregate, run_probe
from robusttrain.metamorphic.scoring import (
    CaseScores,
    dice_from_sums,
    iou_from_sums,
    logits_to_probabilities,
    probabilities_to_labels,
    slice_sums,
)
from robusttrain.metamorphic.suite import MRSuite, pack_cache, stable_seed, unpack_cache

COLOUR = ["saturation", "contrast", "white_balance"]


def test_slice_sums_hand_computed_multiclass():
    pred = torch.tensor([[[0, 1, 1], [2, 2, 0]]])
    gt = torch.tensor([[[0, 1, 0], [2, 0, 0]]])
    s = slice_sums(pred, gt, num_classes=3)
    assert s.tolist() == [[[1, 2, 1], [1, 2, 1]]]
    assert np.allclose(dice_from_sums(s), [[2 / 3, 2 / 3]])
    assert np.allclose(iou_from_sums(s), [[0.5, 0.5]])


def test_empty_target_and_prediction_is_perfect_but_false_positive_is_zero():
    empty = torch.zeros(1, 4, 4, dtype=torch.long)
    fp = empty.clone()
    fp[0, 0, 0] = 1
    assert dice_from_sums(slice_sums(empty, empty, 2)).item() == 1.0
    assert iou_from_sums(slice_sums(empty, empty, 2)).item() == 1.0
    assert dice_from_sums(slice_sums(fp, empty, 2)).item() == 0.0
    assert iou_from_sums(slice_sums(empty, fp, 2)).item() == 0.0


def test_volume_sums_differ_from_mean_of_slice_scores():
    # slice 0: large structure, perfect; slice 1: 1 gt pixel, missed; slice 2: empty/empty
    gt = torch.zeros(3, 4, 4, dtype=torch.long)
    gt[0, :2] = 1
    gt[1, 3, 3] = 1
    pred = torch.zeros_like(gt)
    pred[0, :2] = 1
    s = slice_sums(pred, gt, 2)
    cs = CaseScores(["fg"])
    cs.add(["v"] * 3, s)
    assert cs.sums["v"].tolist() == [[8, 8, 9]]
    assert cs.scores("dice")["v"][0] == pytest.approx(16 / 17)
    assert cs.scores("iou")["v"][0] == pytest.approx(8 / 9)
    assert dice_from_sums(s)[:, 0].mean() == pytest.approx(2 / 3)  # the slice mean is not the case score


def test_probabilities_sigmoid_and_softmax():
    logit = torch.tensor([[[[2.0, -2.0]]]])
    probs = logits_to_probabilities(logit)
    assert probs.shape == (1, 2, 1, 2)
    assert probabilities_to_labels(probs).tolist() == [[[1, 0]]]
    three = torch.zeros(1, 3, 1, 1)
    three[0, 2] = 5
    assert probabilities_to_labels(logits_to_probabilities(three)).item() == 2


def test_efr_threshold_is_strict_and_zero_source_is_not_an_error():
    assert is_error([1.0], [0.75], 0.25).tolist() == [False]  # drop == t is not > t
    assert is_error([1.0], [0.7499], 0.25).tolist() == [True]
    assert is_error([0.0], [0.0], 0.25).tolist() == [False]
    assert is_error([0.8], [0.3], 0.5).tolist() == [True]  # drop 0.625
    cases = pd.DataFrame(
        {
            "perturbation": ["a", "a", "b", "b"],
            "severity": [2, 4, 2, 2],
            "src_dice": [1.0, 1.0, 0.8, 0.8],
            "fol_dice": [0.6, 0.4, 0.8, 0.1],
            "src_iou": [1.0, 1.0, 0.8, 0.8],
            "fol_iou": [1.0, 1.0, 0.8, 0.8],
        }
    )
    t = efr_table(cases)
    m = efr_metrics(t)
    assert m["mr/efr/a/dice@0.25"] == 1.0 and m["mr/efr/a/dice@0.5"] == 0.5
    assert m["mr/efr/b/dice@0.5"] == 0.5 and m["mr/efr/all/dice@0.25"] == 0.75
    assert m["mr/efr/all/iou@0.25"] == 0.0
    row = t[(t.perturbation == "a") & (t.severity == 4) & (t.metric == "dice") & (t.threshold == 0.5)]
    assert row[["errors", "cases"]].values.tolist() == [[1, 1]]


def test_efr_rows_carry_the_perturbed_dice_the_worst_family_and_the_heldout_label():
    # a: fol 0.6 (sev 2), 0.4 (sev 4) -> mean 0.5; b: fol 0.8, 0.1 (both sev 2) -> mean 0.45 (the worst)
    cases = pd.DataFrame(
        {
            "perturbation": ["a", "a", "b", "b"],
            "severity": [2, 4, 2, 2],
            "src_dice": [1.0, 1.0, 0.8, 0.8],
            "fol_dice": [0.6, 0.4, 0.8, 0.1],
            "src_iou": [1.0, 1.0, 0.8, 0.8],
            "fol_iou": [1.0, 1.0, 0.8, 0.8],
        }
    )
    t = efr_table(cases, heldout=["b"])
    assert list(t.columns) == TABLE_COLUMNS and set(ENDPOINT_COLUMNS) <= set(t.columns)
    at = lambda p, s: t[(t.perturbation == p) & (t.severity == s)]
    assert at("a", 4).mean_fol_dice.tolist() == pytest.approx([0.4] * 4)
    assert at("a", 2).mean_fol_dice.tolist() == pytest.approx([0.6] * 4)
    assert at("a", 0).mean_fol_dice.tolist() == pytest.approx([0.5] * 4)
    assert at("a", 0).mean_src_dice.tolist() == pytest.approx([1.0] * 4)
    assert at("b", 0).mean_fol_dice.tolist() == pytest.approx([0.45] * 4)
    every = at("all", 0)
    assert len(every) == 4  # 2 metrics x 2 thresholds, the same Dice on each
    assert every.mean_fol_dice.tolist() == pytest.approx([(0.6 + 0.4 + 0.8 + 0.1) / 4] * 4)
    assert every.mean_src_dice.tolist() == pytest.approx([0.9] * 4)
    assert set(every.worst_family) == {"b"} and every.worst_family_dice.tolist() == pytest.approx([0.45] * 4)
    assert at("a", 0).worst_family.isna().all()  # only the pooled rows name a worst family
    assert t[t.perturbation == "b"].heldout.all() and not t[t.perturbation != "b"].heldout.any()
    m = efr_metrics(t)
    assert m["mr/perturbed_dice/a"] == pytest.approx(0.5) and m["mr/perturbed_dice/all"] == pytest.approx(
        0.475
    )
    assert m["mr/perturbed_dice/worst_family"] == pytest.approx(0.45)
    assert m["mr/perturbed_dice/heldout"] == pytest.approx(0.45)  # b's 2 cases
    assert m["mr/perturbed_dice/trained"] == pytest.approx(0.5)  # a's 2 cases
    assert "mr/perturbed_dice/heldout" not in efr_metrics(efr_table(cases))  # nothing held out: no split
    assert m["mr/efr/a/dice@0.25"] == 1.0  # the rates are unchanged


def test_stable_seed_is_stable_and_distinct():
    assert (
        stable_seed(0, "p1", "blur", 2) == 1989049180777393936
    )  # pinned: seeds must never change between versions
    assert stable_seed(0, "p1", "blur", 2) == stable_seed(0, "p1", "blur", 2)
    assert len({stable_seed(0, c, p, s) for c in "ab" for p in ("x", "y") for s in (2, 4)}) == 8


def _images(n=4, c=3, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    # uint8-representable values so both paths start from identical inputs
    return torch.randint(0, 256, (n, c, size, size), generator=g).float() / 255


def test_suite_params_cached_deterministic_and_per_case():
    img = _images()
    a, b = MRSuite(COLOUR, (2, 4), seed=3), MRSuite(COLOUR, (2, 4), seed=3)
    a.prepare(3)
    b.prepare(3)
    assert a.tests == [(n, s) for n in COLOUR for s in (2, 4)]
    pa = a.params_for("val", 1, ["c0", "c1"], [0, 0], img[:2])
    # different batch composition / order: same params per (case, slice)
    pb = b.params_for("val", 1, ["c1"], [0], img[1:2]) + b.params_for("val", 1, ["c0"], [0], img[:1])
    assert all(torch.equal(pa[0][k], pb[1][k]) and torch.equal(pa[1][k], pb[0][k]) for k in pa[0])
    assert not all(torch.equal(pa[0][k], pa[1][k]) for k in pa[0])
    # restored from state: no re-sampling needed, same values
    c = MRSuite(COLOUR, (2, 4), seed=3)
    c.prepare(3)
    c.load_state_dict(a.state_dict())
    restored = c.cached("val", 1, "c0", 0)
    assert restored is not None and all(torch.equal(restored[k], pa[0][k]) for k in pa[0])
    assert MRSuite(COLOUR, (2, 4), seed=4).state_dict()["seed"] == 4


def test_suite_cache_state_is_packed_and_restores_the_same_params(tmp_path):
    img = _images()
    a = MRSuite(COLOUR, (2, 4), seed=3)
    a.prepare(3)
    for k in range(len(a.tests)):
        a.params_for("val", k, ["c0", "c1", "c2"], [0, 1, 0], img[:3])
    cache = dict(a._cache)
    state = a.state_dict()
    # one tensor per (group, param), not per entry: what made every checkpoint save slow
    n_tensors = sum(len(g["params"]) for g in state["cache"]["groups"])
    assert n_tensors < sum(len(p) for p in cache.values())
    torch.save(state, tmp_path / "s.pt")
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)  # a checkpoint's state loads weights-only
    for restored in (unpack_cache(loaded["cache"]), unpack_cache([[list(k), v] for k, v in cache.items()])):
        assert list(restored) == list(cache)  # same entries, same order
        for key, params in cache.items():
            assert list(restored[key]) == list(params)
            for n, v in params.items():
                assert restored[key][n].dtype == v.dtype and torch.equal(restored[key][n], v)
    b = MRSuite(COLOUR, (2, 4), seed=3)
    b.prepare(3)
    b.load_state_dict(loaded)
    assert list(b._cache) == list(cache)
    assert b.state_dict()["cache"]["order"].tolist() == state["cache"]["order"].tolist()
    # grown after the state was taken: the next state packs the new entry too
    a.params_for("val", 0, ["c9"], [0], img[3:4])
    assert len(unpack_cache(a.state_dict()["cache"])) == len(cache) + 1
    assert pack_cache({})["groups"] == []


def test_rgb_only_families_are_skipped_on_one_channel(caplog):
    fams = [n for n in P.available() if n in ("saturation", "blur")]
    s = MRSuite(fams, (2,))
    with caplog.at_level("WARNING"):
        s.prepare(1, probe=_images(1, c=1))
    assert "saturation" in s.skipped and all(n != "saturation" for n, _ in s.tests)
    assert "skipped" in caplog.text
    if "blur" in P.available():  # channel-agnostic families still run
        assert ("blur", 2) in s.tests


def _threshold_predict(x):
    # a fixed "model": foreground where the red channel is bright
    p = torch.sigmoid(40 * (x[:, :1] - 0.5))
    return torch.cat([1 - p, p], 1)


def _blobs(n=6, size=32):
    img = torch.full((n, 3, size, size), 60 / 255)
    mask = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        r = 4 + i
        img[i, :, 8 : 8 + r, 6 : 6 + 2 * r] = torch.tensor([200, 120, 100]).view(3, 1, 1) / 255
        mask[i, 8 : 8 + r, 6 : 6 + 2 * r] = 1
    return img, mask


def test_torch_and_numpy_paths_give_the_same_error_decisions():
    img, mask = _blobs()
    ds = [{"image": img[i], "mask": mask[i], "case_id": f"c{i // 2}", "slice_index": i % 2} for i in range(6)]
    tables = {}
    for path in ("torch", "numpy"):
        suite = MRSuite(COLOUR, (2, 4), seed=0)
        res = run_probe(
            _threshold_predict, iter_probe(ds, range(6), 4, BatchHooks()), suite, "val", path=path
        )
        _, cases = aggregate(res, ["polyp"], 0, suite)
        tables[path] = cases
    t, n = tables["torch"], tables["numpy"]
    assert len(t) == 3 * 6
    assert (t["drop_dice"] > 0.25).tolist() == (n["drop_dice"] > 0.25).tolist()
    assert (t["drop_dice"] > 0.25).any() and not (t["drop_dice"] > 0.25).all()  # decisions are non-trivial
    assert np.allclose(t["fol_dice"], n["fol_dice"], atol=0.02)
    assert efr_table(t).equals(efr_table(n))


def test_probe_result_merge_deduplicates_padded_ranks():
    img, mask = _blobs(4)
    ds = [(img[i], mask[i]) for i in range(4)]
    suite = MRSuite(["contrast"], (2,), seed=0)
    full = run_probe(_threshold_predict, iter_probe(ds, range(4), 2, BatchHooks()), suite, "val")
    r0 = run_probe(_threshold_predict, iter_probe(ds, [0, 2], 2, BatchHooks()), suite, "val")
    r1 = run_probe(_threshold_predict, iter_probe(ds, [1, 3, 0], 2, BatchHooks()), suite, "val")  # padded
    merged = ProbeResult.merge([r1, r0])
    assert merged.index.tolist() == [0, 1, 2, 3] and merged.case_id == ["idx0", "idx1", "idx2", "idx3"]
    assert np.array_equal(merged.fol, full.fol) and np.array_equal(merged.src, full.src)


def test_default_hooks_read_dicts_and_tuples_and_name_the_hook_to_set():
    img, mask = _blobs(2)
    pb = next(iter_probe([(img[0], mask[0][None].float())], [0], 1, BatchHooks()))  # (1,H,W) float mask
    assert pb.case_ids == ["idx0"] and pb.masks.dtype == torch.long and pb.masks.shape == (1, 32, 32)
    with pytest.raises(HookError, match="get_images="):
        next(iter_probe([{"x": img[0]}], [0], 1, BatchHooks()))
    with pytest.raises(HookError, match="get_masks="):
        next(iter_probe([{"image": img[0]}], [0], 1, BatchHooks()))
    hooks = BatchHooks(get_images=lambda b: b["x"], get_masks=lambda b: b["y"])
    pb = next(iter_probe([{"x": img[1], "y": mask[1]}], [0], 1, hooks))
    assert pb.images.shape == (1, 3, 32, 32)


def test_two_class_labels_equal_argmax_including_ties():
    import torch

    from robusttrain.metamorphic.scoring import probabilities_to_labels

    p = torch.rand(3, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    p[:, 1, :3] = p[:, 0, :3]  # ties -> class 0, like argmax
    assert torch.equal(probabilities_to_labels(p), p.argmax(1))


def test_the_check_on_an_accelerator_scores_what_the_cpu_scores():
    # the MR check's torch path (as on a GPU: path="torch", model and probe batch on the device) on the emulated
    # accelerator of robusttrain/testing/emulated_device.py: any host tensor mixed into a device op fails there as on
    # CUDA; the per-slice sums equal the CPU's (params are drawn per case on the host in both)
    from robusttrain.metamorphic.batch import ProbeBatch
    from robusttrain.testing.emulated_device import EmulatedDevice

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))
    x = torch.rand(3, 3, 64, 64)
    m = torch.zeros(3, 64, 64, dtype=torch.long)
    m[:, 20:40, 24:44] = 1

    def check(device):
        suite = MRSuite(["contrast", "blur", "specularity", "instrument", "text"], severities=(2, 5))
        suite.prepare(3)
        model = net.to(device)
        pb = ProbeBatch([0, 1, 2], x.to(device), m.to(device), ["a", "b", "c"], [0, 0, 0])
        return run_probe(lambda t: torch.softmax(model(t), 1), [pb], suite, "val", path="torch")

    cpu = check(torch.device("cpu"))
    with EmulatedDevice() as dev:
        acc = check(dev.device)
        assert dev.device_ops  # it ran on the device
    for name in ("src", "fol", "cons"):
        assert np.array_equal(getattr(cpu, name), getattr(acc, name)), name
    assert cpu.fol.sum() > 0
