"""BatchAugmentation: every registered family as a Kornia-style batch augmentation (p, per-sample params, replay)."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from toys import quiet_trainer

import robusttrain.perturbations as P
from robusttrain.perturbations.augment import BatchAugmentation


class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3, padding=1)
        g = torch.Generator().manual_seed(0)  # fixed weights: the tests do not depend on the global RNG
        with torch.no_grad():
            self.conv.weight.copy_(0.3 * torch.randn(self.conv.weight.shape, generator=g))
            self.conv.bias.zero_()

    def forward(self, x):
        return self.conv(x)


def _kwargs(family):
    """Constructor arguments a family needs beyond severity (the model of ``adversarial``)."""
    params = inspect.signature(P.family_class(family).__init__).parameters
    return {"model": TinyNet()} if "model" in params else {}


GREY_ONLY = set(P.available()) - set(P.available(channels=3))  # MRI / X-ray families


def _batch(b=6, s=128, seed=0, family=None):
    """Textured frames with a few specular highlights (what ``melt`` removes) and a flat lesion in the centre;
    one grey channel for the single-channel families."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(float(s)), torch.arange(float(s)), indexing="ij")
    x = torch.stack([0.6 + 0.2 * torch.sin(xx / 7), 0.35 + 0.15 * torch.cos(yy / 5), 0.25 + 0 * xx])
    x = (x[None].repeat(b, 1, 1, 1) + 0.03 * torch.randn(b, 3, s, s, generator=g)).clamp(0, 1)
    for i in range(b):
        for _ in range(3):
            y0, x0 = torch.randint(8, s - 12, (2,), generator=g).tolist()
            x[i, :, y0 : y0 + 4, x0 : x0 + 4] = 1.0
    c = s // 2
    m = torch.zeros(b, s, s, dtype=torch.long)
    m[:, c - 8 : c + 8, c - 8 : c + 8] = 1
    x[:, :, c - 8 : c + 8, c - 8 : c + 8] = 0.5
    return (x.mean(1, keepdim=True) if family in GREY_ONLY else x), m


FAMILIES = P.available()


@pytest.mark.parametrize("family", FAMILIES)
def test_p0_identity_and_p1_changes_every_sample(family):
    x, m = _batch(family=family)
    kept = x.clone()
    aug0 = BatchAugmentation(family, severity=(1, 5), p=0.0, **_kwargs(family))
    out = aug0(x, mask=m)
    assert torch.equal(out, kept) and not aug0._params["batch_prob"].any()
    assert not aug0._params["severity"].any()
    aug1 = BatchAugmentation(family, severity=(1, 5), p=1.0, **_kwargs(family))
    out = aug1(x, mask=m, generator=torch.Generator().manual_seed(1))
    assert aug1._params["batch_prob"].all()
    assert (out != x).flatten(1).any(1).all(), "every selected sample is perturbed"
    assert torch.equal(x, kept) and out.shape == x.shape and out.dtype == x.dtype


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_is_bit_exact_and_only_selected_samples_change(family):
    x, m = _batch(8, family=family)
    aug = BatchAugmentation(family, severity=(2, 5), p=0.5, **_kwargs(family))
    out = aug(x, mask=m, generator=torch.Generator().manual_seed(3))
    params = aug._params
    chosen = params["batch_prob"]
    assert 0 < int(chosen.sum()) < 8  # this seed selects some, not all
    assert torch.equal(out[~chosen], x[~chosen])
    assert (out[chosen] != x[chosen]).flatten(1).any(1).all()
    assert torch.equal(params["severity"] > 0, chosen)
    again = aug(x, mask=m, params=params)
    assert torch.equal(again, out)
    assert aug._params is params
    # the same generator seed draws the same params; sampling and applying are separate steps
    assert torch.equal(aug(x, mask=m, generator=torch.Generator().manual_seed(3)), out)
    drawn = aug.generate_parameters(x, m, torch.Generator().manual_seed(3))
    assert drawn.keys() == params.keys() and all(torch.equal(drawn[k], params[k]) for k in params)
    assert torch.equal(aug.apply(x, drawn, m), out)


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_severities_match_the_family_applied_per_sample(family):
    x, m = _batch(8, family=family)
    aug = BatchAugmentation(family, severity=(1, 5), p=1.0, **_kwargs(family))
    out = aug(x, mask=m, generator=torch.Generator().manual_seed(0))
    sev = aug._params["severity"]
    assert len(set(sev.tolist())) >= 3 and set(sev.tolist()) <= {1, 2, 3, 4, 5}
    for s in sorted(set(sev.tolist())):
        idx = torch.nonzero(sev == s).flatten()
        fam = {k.split(".", 1)[1]: v for k, v in aug._params.items() if k.startswith(f"s{s}.")}
        assert fam and all(v.shape[0] == len(idx) for v in fam.values())
        assert aug.perturbation(s).severity == s
        for j, i in enumerate(idx.tolist()):  # each sample: its own severity's perturbation with its own row
            one = {k: v[j : j + 1] for k, v in fam.items()}
            ref, _ = aug.perturbation(s).apply_batch(x[i : i + 1], m[i : i + 1], params=one)
            assert torch.allclose(out[i : i + 1], ref, atol=1e-6), (s, i)


# families whose params are a function of the image and the model, not drawn: named, so that a family
# whose draws stopped depending on the generator fails below instead of being skipped
DETERMINISTIC = {"adversarial"}


@pytest.mark.parametrize("family", FAMILIES)
def test_params_differ_between_samples(family):
    x, m = _batch(8, family=family)
    aug = BatchAugmentation(family, severity=3, p=1.0, **_kwargs(family))
    other = aug.generate_parameters(x, m, torch.Generator().manual_seed(1))
    aug(x, mask=m, generator=torch.Generator().manual_seed(0))
    same = all(torch.equal(v, other[k]) for k, v in aug._params.items())
    if family in DETERMINISTIC:
        assert same, f"{family} is listed as drawing nothing but its params depend on the seed"
        return
    assert not same, f"{family}: seeds 0 and 1 drew the same params"
    rows = torch.cat([v.reshape(8, -1).double() for k, v in aug._params.items() if k.startswith("s3.")], 1)
    assert rows.shape[0] == 8
    # drawn per sample, not once per batch (melt has only 6 possible draws, so not all 8 can differ)
    assert len({tuple(r.tolist()) for r in rows}) >= 4


def test_family_arguments_and_existing_objects_are_used_at_every_severity():
    x, m = _batch(8)
    aug = BatchAugmentation("blur", severity=(1, 5), p=1.0, noise=False)
    aug(x, mask=m, generator=torch.Generator().manual_seed(0))
    noise = [v for k, v in aug._params.items() if k.endswith(".noise")]
    assert len(noise) >= 3 and all(int(v.abs().sum()) == 0 for v in noise)
    wb = P.get("white_balance", severity=4, cast="purple")
    aug = BatchAugmentation(wb, severity=(3, 5), p=1.0)
    assert aug.perturbation(4) is wb and aug.perturbation(5).cast == "purple"
    aug(x, generator=torch.Generator().manual_seed(0))
    assert all(
        bool((v == 1).all()) for k, v in aug._params.items() if k.endswith(".cast")
    )  # CASTS[1] == purple
    assert BatchAugmentation(wb).severity == (4, 4) and "white_balance" in repr(BatchAugmentation(wb))


def test_usable_in_sequential_and_lesion_untouched():
    x, m = _batch(4)
    seq = torch.nn.Sequential(BatchAugmentation("saturation", p=1.0), BatchAugmentation("blur", p=1.0))
    assert seq(x).shape == x.shape
    aug = BatchAugmentation("instrument", severity=5, p=1.0)
    out = aug(x, mask=m[:, None])  # (B,1,H,W) masks accepted too
    assert torch.equal(out[:, :, m[0] != 0], x[:, :, m[0] != 0])


def test_bad_construction_and_bad_params_are_clear_errors():
    for bad in (0, 6, (4, 2), (0, 3), (1, 2, 3), True, 2.5, "3"):
        with pytest.raises(ValueError, match=r"severity must be an int in 1..5 or a \(low, high\) pair"):
            BatchAugmentation("blur", severity=bad)
    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(ValueError, match=r"p must be a probability in \[0, 1\]"):
            BatchAugmentation("blur", p=bad)
    with pytest.raises(ValueError, match="unknown perturbation 'blurr'; valid choices"):
        BatchAugmentation("blurr")
    with pytest.raises(ValueError, match="cast must be one of"):
        BatchAugmentation("white_balance", cast="blue")
    with pytest.raises(ValueError, match="pass one or the other"):
        BatchAugmentation(P.get("blur"), noise=False)
    with pytest.raises(TypeError, match="registered name or a Perturbation"):
        BatchAugmentation(3)
    aug = BatchAugmentation("contrast", p=1.0)
    x, _ = _batch(4, 32)
    aug(x)
    with pytest.raises(ValueError, match=r"params\['batch_prob'\] must be a tensor of shape \(B,\) with B=2"):
        aug(x[:2], params=aug._params)
    with pytest.raises(ValueError, match="no 's3.\\*' entries"):
        aug(x, params={"batch_prob": torch.ones(4, dtype=torch.bool), "severity": torch.full((4,), 3)})
    with pytest.raises(ValueError, match="images must have shape"):
        aug(x[0])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_batch_matches_cpu_and_replays(family):
    x, m = _batch(6, family=family)
    kw = _kwargs(family)
    if "model" in kw:
        kw["model"] = kw["model"].cuda()
    aug = BatchAugmentation(family, severity=(1, 5), p=0.7, **kw)
    out = aug(x.cuda(), mask=m.cuda(), generator=torch.Generator().manual_seed(0))
    assert out.is_cuda and torch.equal(aug(x.cuda(), mask=m.cuda(), params=aug._params), out)
    if "model" not in kw:  # same params on the CPU: the two paths agree
        cpu = BatchAugmentation(family, severity=(1, 5), p=0.7)
        ref = cpu(x, mask=m, params={k: v.cpu() for k, v in aug._params.items()})
        assert float((out.cpu() - ref).abs().max()) <= 1 / 255


@pytest.mark.slow
def test_runs_in_on_after_batch_transfer_of_a_real_trainer():
    """The intended use: perturb training batches after they reach the device, inside Lightning."""
    import lightning.pytorch as L
    from torch.utils.data import DataLoader, Dataset

    x, m = _batch(8, 32)

    class Frames(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"image": x[i], "mask": m[i]}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, self.aug, self.seen = TinyNet(), BatchAugmentation("blur", severity=(1, 5), p=1.0), []

        def on_after_batch_transfer(self, batch, dataloader_idx):
            if self.trainer.training:
                clean = batch["image"].clone()
                batch["image"] = self.aug(batch["image"], mask=batch["mask"])
                self.seen.append((clean, batch["mask"], batch["image"], self.aug._params))
            return batch

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.net(batch["image"]), batch["mask"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    model = Module()
    quiet_trainer(max_epochs=1).fit(model, DataLoader(Frames(), batch_size=4))
    assert len(model.seen) == 2
    for clean, mask, out, params in model.seen:
        assert (out != clean).flatten(1).any(1).all()
        assert torch.equal(model.aug(clean, mask=mask, params=params), out)


@pytest.mark.parametrize("p", [1.0, 0.0])
def test_a_batch_with_the_wrong_channels_is_refused_whole_whatever_the_draw_picks(p):
    # the check ran on each severity's sub-batch: the error named a (1,1,64,64) shape for a (4,1,64,64)
    # batch, and at p=0 (nothing picked) a grey batch passed a colour family silently
    with pytest.raises(ValueError, match=re.escape("needs RGB images") + ".*" + re.escape("(4, 1, 64, 64)")):
        BatchAugmentation("saturation", severity=(1, 5), p=p)(torch.rand(4, 1, 64, 64))
    with pytest.raises(
        ValueError, match=re.escape("needs single-channel (grey) images") + ".*" + re.escape("(4, 3, 64, 64)")
    ):
        BatchAugmentation("gibbs", severity=(1, 5), p=p)(torch.rand(4, 3, 64, 64))
    assert BatchAugmentation("blur", severity=(1, 5), p=p)(torch.rand(4, 1, 64, 64)).shape == (4, 1, 64, 64)


@pytest.mark.parametrize("family", ["specularity", "instrument", "blur", "text"])
def test_batch_augmentation_on_an_accelerator_gives_the_cpu_s_batch(family):
    # the accelerator branches on the emulated device of robusttrain/testing/emulated_device.py (host tensors
    # mixed into device ops fail as on CUDA): the CPU's images, and a placed family's severity groups read the
    # placement maps back once for the draw and once for the render, not once or twice per group
    from robusttrain.testing.emulated_device import EmulatedDevice, on_host

    torch.manual_seed(0)
    x = torch.rand(12, 3, 96, 96)
    m = torch.zeros(12, 96, 96, dtype=torch.long)
    m[:, 30:60, 30:60] = 1
    aug = BatchAugmentation(family, severity=(1, 5), p=0.6)
    ref = aug(x, m, generator=torch.Generator().manual_seed(1))
    with EmulatedDevice() as dev:
        out = on_host(aug(x.to(dev.device), m.to(dev.device), generator=torch.Generator().manual_seed(1)))
    assert float((out - ref).abs().max()) < 1e-5
    assert dev.syncs <= 2, dev.syncs
