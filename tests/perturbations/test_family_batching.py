"""One call per family (issue 31): ``sample_family`` / ``apply_family`` with per-row severities, for every
registered family (the generic per-severity fallback covers any family that only implements the
``sample_params`` / ``apply_batch`` contract), ``WorstOfK`` drawing through them, and the launch count of
one k=1 draw (top-level aten ops on CPU, a proxy for GPU kernel launches; counted, not timed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_conformance import CASES, IDS, batch, images, make

import robusttrain.perturbations as P
from robusttrain.perturbations.suites import SUITES
from robusttrain.training.worst_of_k import WorstOfK

SEV = [1, 5, 3, 5, 2]


@pytest.mark.parametrize(("name", "channels"), CASES, ids=IDS)
def test_one_severity_draws_what_sample_params_draws(name, channels):
    """All rows at one severity: the family call draws exactly today's params from the same stream."""
    imgs, masks = images(channels, b=3)
    x, m = batch(imgs, torch.device("cpu")), torch.from_numpy(np.stack(masks))
    for s in (1, 4):
        op = make(name, channels, severity=s)
        want = op.sample_params(x, m, generator=torch.Generator().manual_seed(5))
        groups = make(name, channels, severity=3).sample_family(
            x, m, [s] * 3, torch.Generator().manual_seed(5)
        )
        assert len(groups) == 1 and groups[0][0].tolist() == [0, 1, 2]
        got = groups[0][1]
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), name


@pytest.mark.parametrize(("name", "channels"), CASES, ids=IDS)
def test_mixed_severities_replay_and_match_each_rows_severity(name, channels):
    """Mixed severities: replay is exact, and every row is what its own severity's op makes of its params."""
    imgs, masks = images(channels, b=5, seed=1)
    x, m = batch(imgs, torch.device("cpu")), torch.from_numpy(np.stack(masks))
    op = make(name, channels)
    out, groups = op.apply_family(x, m, SEV, torch.Generator().manual_seed(2))
    again, _ = op.apply_family(x, m, SEV, params=groups)
    assert torch.equal(out, again)
    assert sorted(r for rows, _ in groups for r in rows.tolist()) == list(range(5))
    if op.batched_severities():
        assert len(groups) == 1  # one call for the whole family
    for rows, p in groups:
        for j, r in enumerate(rows.tolist()):
            one = {k: v[j : j + 1] for k, v in p.items()}
            y, _ = make(name, channels, severity=SEV[r]).apply_batch(x[r : r + 1], m[r : r + 1], params=one)
            assert torch.allclose(y, out[r : r + 1], atol=1e-5), (name, r)


def test_bad_severities_are_refused_with_one_line():
    x = torch.rand(2, 3, 16, 16)
    with pytest.raises(ValueError, match="one entry per image"):
        P.get("contrast").sample_family(x, None, [1, 2, 3])
    with pytest.raises(ValueError, match=r"integers 1..5, got values in \[0, 2\]"):
        P.get("contrast").sample_family(x, None, [0, 2])


def _batch(b: int, size: int = 64):
    torch.manual_seed(0)
    x = torch.rand(b, 3, size, size)
    m = torch.zeros(b, size, size, dtype=torch.long)
    m[:, size // 3 : 2 * size // 3, size // 3 : 2 * size // 3] = 1
    return x, m


@pytest.mark.parametrize("k", [1, 3])
def test_worst_of_k_same_seed_same_followups_and_exact_replay(k):
    x, m = _batch(12)
    score = lambda c, mm: (c - 0.5).abs().mean((1, 2, 3))  # noqa: E731
    a = WorstOfK(SUITES["endoscopy"], k=k, q=0.75, epsilon=1.0, seed=4)(x, m, score, step=7)
    b = WorstOfK(SUITES["endoscopy"], k=k, q=0.75, epsilon=1.0, seed=4)(x, m, score, step=7)
    assert torch.equal(a.images, b.images) and a.families == b.families and a.severities == b.severities
    assert len({f for row in a.families for f in row}) >= 4  # several families, mixed severities, in one call
    assert torch.equal(a.replay(x, m), a.images)
    for i, rec in enumerate(a.kept()):  # every kept follow-up re-created alone from its record
        if rec is not None:
            fam, sev, p = rec
            pos = int(a.index[i])
            y, _ = P.get(fam, sev).apply_batch(x[pos : pos + 1], m[pos : pos + 1], params=p)
            assert torch.allclose(y[0], a.images[i], atol=1e-5), fam


def test_worst_of_k_computes_the_field_of_view_once_per_call(monkeypatch):
    import robusttrain.perturbations.border as border
    import robusttrain.perturbations.placement as placement

    calls = []
    real = placement.fov_from_cells
    monkeypatch.setattr(placement, "fov_from_cells", lambda low, *a: calls.append(1) or real(low, *a))
    monkeypatch.setattr(border, "fov_from_cells", placement.fov_from_cells)
    x, m = _batch(16)
    wok = WorstOfK(["specularity", "instrument", "feces", "blood"], k=4, q=1.0, epsilon=1.0, seed=0)
    wok(x, m, lambda c, mm: c.mean((1, 2, 3)), step=0)
    assert len(calls) == 1


def test_pasted_objects_render_together_as_each_alone():
    # instrument, feces and blood share one renderer: WorstOfK renders the ones it draws in one call; each
    # row must get exactly the pixels of its own family's render (its own window: severities 5, 1, 3 differ)
    from robusttrain.perturbations.objects import PastedObject

    x, m = _batch(12, 128)
    g = torch.Generator().manual_seed(1)
    parts = []
    for i, (fam, sev) in enumerate((("instrument", 5), ("feces", 1), ("blood", 3))):
        op = P.get(fam, sev)
        parts.append((op, op.sample_params(x[4 * i : 4 * i + 4], m[4 * i : 4 * i + 4], g), 4))
    alone = [
        op.apply_batch(x[4 * i : 4 * i + 4], m[4 * i : 4 * i + 4], params=p)[0]
        for i, (op, p, _) in enumerate(parts)
    ]
    assert torch.equal(PastedObject.render_together(x, m, parts), torch.cat(alone))
    assert len({op._half(*x.shape[-2:]) for op, _, _ in parts}) > 1


def test_feces_and_blood_placed_together_as_each_alone():
    # WorstOfK draws each family's random values at its turn and places feces and blood rows in one pass
    # (objects_joint): every param must be bit for bit what each family's own sampler gives on its rows
    x, m = _batch(12, 128)
    parts = [(P.get("feces", 5), [1, 3, 5, 2, 2]), (P.get("blood", 5), [4, 4, 1, 3, 5, 2, 1])]
    rows = [slice(0, 5), slice(5, 12)]
    g = torch.Generator().manual_seed(3)
    alone = [op.sample_family(x[r], m[r], sev, g)[0][1] for (op, sev), r in zip(parts, rows)]
    g = torch.Generator().manual_seed(3)
    drawn = [op.deferred_draw(x[r], g) for (op, _), r in zip(parts, rows)]
    together = type(parts[0][0]).sample_together(x, m, [(op, sev, d) for (op, sev), d in zip(parts, drawn)])
    for a, b in zip(alone, together):
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


# Launch count of one k=1 draw at 256 px, batch 16, q=0.5, the nine endoscopy families (benchmarks/perf/
# launch_count.py). Before issue 31: ~2,300; 1,653 before issue 31 section 1's batching pass, 961 before its
# second pass (fewer ops per family call: views and no-op casts folded, y/x pairs in one op, the pasted objects
# rendered in one call, rows taken in one gather), 584 before its third (text's severity groups drawn and rendered
# in one pass, feces and blood placed in one pass). CEILING is what this branch reaches plus ~10 %, so a change
# that adds per-image or per-severity work fails here; TARGET is issue 31's goal, met where the ops run (on the
# device; the test at the end of this file): on the CPU every op counts, the host's placement maths included.
CEILING = 600  # 549 measured here (steps 2-3), 542 over steps 2-5 (third pass: text, feces + blood)
TARGET = 300


def _k1_count() -> float:
    from benchmarks.perf.launch_count import ops_per_call

    return ops_per_call(1, 256, 16, calls=2)


def test_k1_draw_launch_count_does_not_regress():
    n = _k1_count()
    assert n <= CEILING, f"{n:.0f} aten ops per k=1 draw (ceiling {CEILING})"


def test_the_launch_column_leaves_out_views_allocations_and_no_op_casts_only():
    from benchmarks.perf.launch_count import count_ops

    x = torch.rand(2, 3, 4)
    # views, a no-op cast, an allocation, a constant: no kernel on a GPU
    assert count_ops(lambda: (x.view(6, 4), x[0], x.unbind(1), x.to(torch.float32), torch.empty(3))) == (5, 0)
    # a reshape that has to copy, a real cast, a fill, arithmetic: each a kernel
    # (the transpose before the copy is one more op, a view)
    copies = lambda: (x.transpose(1, 2).reshape(2, 12), x.long(), x.new_zeros(3), x * 2, x.sum())  # noqa: E731
    assert count_ops(copies) == (6, 5)


def test_compiled_render_benchmark_fuses_a_colour_family_into_one_graph():
    # benchmarks/perf/compiled_render.py: what torch.compile does to a render (issue 31's route below 300)
    import shutil

    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("Inductor's CPU backend needs a C++ compiler")
    from benchmarks.perf.compiled_render import measure

    r = measure("contrast", size=64, batch=2)
    assert r["graphs"] == 1  # no graph break in a colour family's render
    assert 0 < r["kernels"] < r["launches"] <= r["ops"]
    assert r["max_diff"] < 1e-5


def test_draw_digests_repeat_for_a_seed_and_differ_between_seeds():
    # benchmarks/perf/draw_digests.py is how a batching pass shows it kept every image (diff two checkouts'
    # outputs): a digest must be a function of the configuration alone, and must see a change in the images
    from benchmarks.perf.draw_digests import digest

    a = digest(64, 4, 1, 0, steps=2)
    assert a == digest(64, 4, 1, 0, steps=2)
    assert len({a, digest(64, 4, 1, 1, steps=2), digest(64, 4, 4, 0, steps=2)}) == 3


# ---- the accelerator code path, on an emulated device (robusttrain/testing/emulated_device.py) ----------------


@pytest.mark.parametrize("kw", [{"k": 1}, {"k": 4}, {"k": 1, "mix": "augmix"}], ids=["k1", "k4", "augmix"])
def test_worst_of_k_on_an_accelerator_draws_the_cpu_s_followups(kw):
    # the accelerator branches (placement on host maps, params moved in one copy per dtype, the blur kernel's
    # width from its table) with every op that mixes a host tensor into a device op refused as CUDA refuses
    # it; the follow-ups are the CPU's up to float rounding (the blur kernel's width differs), the draws equal
    from robusttrain.testing.emulated_device import EmulatedDevice, on_host

    x, m = _batch(16, 96)
    score = lambda c, mm: c.mean((1, 2, 3))  # noqa: E731
    cpu = WorstOfK(SUITES["endoscopy"], q=0.75, epsilon=1.0, seed=3, **kw)
    acc = WorstOfK(SUITES["endoscopy"], q=0.75, epsilon=1.0, seed=3, **kw)
    with EmulatedDevice() as dev:
        xd, md = x.to(dev.device), m.to(dev.device)
        for step in range(3):
            a, b = cpu(x, m, score, step=step), acc(xd, md, score, step=step)
            assert b.images.device == dev.device
            assert a.families == b.families and a.severities == b.severities
            assert float((on_host(b.images) - a.images).abs().max()) < 1e-5
            assert torch.equal(on_host(b.index), a.index)
            if a.chains is not None:  # each chain step's recorded params are the CPU's, on the host
                steps = [
                    (o, p)
                    for row_a, row_b in zip(a.chains, b.chains)
                    for ca, cb in zip(row_a, row_b)
                    for la, lb in zip(ca["chains"], cb["chains"])
                    for o, p in zip(la, lb)
                ]
                assert steps and all(o["family"] == p["family"] for o, p in steps)
                assert all(
                    v.device.type == "cpu" and torch.allclose(v.float(), o["params"][key].float())
                    for o, p in steps
                    for key, v in p["params"].items()
                )
        # per call: the placement maps read once (AugMix chains: once per chain step with a placed family)
        assert dev.syncs <= (3 if "mix" not in kw else 3 * 8)


def test_the_emulated_device_refuses_what_cuda_refuses_and_counts_copies():
    from robusttrain.testing.emulated_device import EmulatedDevice, on_host

    with EmulatedDevice() as dev:
        x = torch.arange(6.0).view(2, 3).to(dev.device)
        with pytest.raises(RuntimeError, match="same device: gather"):
            x.gather(1, torch.zeros(2, 1, dtype=torch.long))
        assert float(x[torch.tensor([1]), [0, 2]].sum()) == 8.0  # host indices: CUDA copies them over
        y = x * torch.tensor(2.0)  # a 0-dim host tensor is a scalar
        copies = dev.to_device
        moved = P.base.params_to(
            {"a": torch.ones(2, 2), "b": torch.zeros(2), "n": torch.arange(2)}, dev.device
        )
        assert dev.to_device - copies == 2  # one copy per dtype
        assert torch.equal(on_host(moved["a"]), torch.ones(2, 2)) and moved["a"].device == dev.device
        assert torch.equal(on_host(y), torch.arange(6.0).view(2, 3) * 2)


@pytest.mark.parametrize(("batch", "limit"), [(16, TARGET), (64, 1.2 * TARGET)])
def test_k1_draw_meets_issue_31_target_on_the_device(batch, limit):
    # issue 31's target counted where the ops run: the aten ops on the (emulated) device per k=1 draw at 256 px,
    # views included (261 / 342 over launch_count's 4 steps on 2026-11-27, 275 / 344 over the 2 counted here);
    # the placement maps are read back once per call, and the copies to the device stay a handful per family
    # (25 at batch 64), not one per param
    from benchmarks.perf.launch_count import device_counts

    d = device_counts(1, 256, batch, calls=2)
    assert d["device_ops"] <= limit, d
    assert d["syncs"] <= 1.0 and d["to_device"] <= 32, d
