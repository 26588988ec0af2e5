"""What GPU users train, on CPU: FlexibleUNet / SegResNet / SwinUNETR with the robustness callbacks (no
check or score moves a BatchNorm statistic), bf16-mixed, a torch.compile'd module, and recipe=polyp_gpu."""

from __future__ import annotations

import importlib.util
import math
import re
import urllib.error

import lightning.pytorch as L
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from toys import Blobs, quiet_trainer

from robusttrain.callbacks import BalancedCheckpoint, MetamorphicCallback, MetamorphicTraining
from robusttrain.errors import InputError
from robusttrain.metamorphic.check import eval_state
from robusttrain.metamorphic.suite import MRSuite
from robusttrain.models import SegmentationModule, build_network

TINY_DECODER = (32, 16, 16, 8, 8)


def bn_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: b.detach().cpu().clone()
        for n, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
        for n, b in (
            (f"{n}.mean", m.running_mean),
            (f"{n}.var", m.running_var),
            (f"{n}.n", m.num_batches_tracked),
        )
    }


def modes(model: nn.Module) -> list[bool]:
    return [m.training for m in model.modules()]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- eval_state, directly
def test_eval_state_leaves_batchnorm_statistics_and_every_mode_as_they_were():
    net = build_network("flexible_unet", 3, 2, backbone="efficientnet-b0", features=TINY_DECODER)
    net.train()
    net.net.encoder._conv_stem.eval()  # a frozen submodule stays frozen after the block
    x = torch.rand(2, 3, 64, 64)
    before, flags = bn_buffers(net), modes(net)
    assert len(before) > 60  # the encoder's and decoder's BatchNorms
    with eval_state(net):
        assert not any(modes(net))
        net(x)
    assert same(bn_buffers(net), before) and modes(net) == flags
    net(x)  # the same forward in train mode does move them: the comparison above can fail
    assert not same(bn_buffers(net), before)


# ----------------------------------------------------------------------------- networks
def test_an_input_size_the_network_cannot_take_is_refused_in_one_line():
    # MONAI's own outcome at these sizes: a size mismatch deep in the decoder (swin_unetr, segresnet,
    # attention_unet), or, for FlexibleUNet at an odd side, no error and an output one pixel short
    flex = SegmentationModule(
        network="flexible_unet", backbone="efficientnet-b0", features=TINY_DECODER
    ).eval()
    with torch.no_grad():
        assert flex.net(torch.rand(1, 3, 65, 64)).shape[-2:] == (64, 64)  # what the check stops
    cases = [
        (flex, (65, 64), 32),
        (SegmentationModule(network="swin_unetr", features=[12]), (100, 96), 32),
        (SegmentationModule(network="segresnet", features=[8]), (36, 40), 8),
        (SegmentationModule(network="attention_unet", features=[8, 16, 32]), (64, 66), 4),
    ]
    for model, sides, multiple in cases:
        with pytest.raises(InputError) as e, torch.no_grad():
            model(torch.rand(1, 3, *sides))
        got = "x".join(map(str, sides))
        assert str(e.value) == (
            f"model.network={model.hparams['network']} needs every image side to be a multiple of {multiple}; "
            f"it got a {got} input (data.image_size, and the size metamorphic_training.score_scale scores at, must "
            f"be multiples of {multiple})"
        )
        ok = tuple(-(-s // multiple) * multiple for s in sides)
        with torch.no_grad():
            assert model.eval()(torch.rand(1, 3, *ok)).shape[-2:] == ok
    basic = SegmentationModule(features=[8, 8, 16, 16, 32, 8])  # BasicUNet pads: any size
    assert basic(torch.rand(1, 3, 37, 41)).shape[-2:] == (37, 41)


def test_networks_build_by_name_and_refuse_bad_values_in_one_line(monkeypatch):
    flex = SegmentationModule(network="flexible_unet", backbone="resnet10", features=TINY_DECODER)
    assert flex(torch.rand(2, 3, 64, 64)).shape == (2, 2, 64, 64)
    seg3d = SegmentationModule(in_channels=1, network="segresnet", features=[8], norm="batch", spatial_dims=3)
    assert seg3d(torch.rand(2, 1, 32, 32, 8)).shape == (2, 2, 32, 32, 8)
    bad = [
        (dict(network="flexible_unet", backbone="efficientnet-b9"), "model.backbone must be one of"),
        (
            dict(network="flexible_unet", backbone="resnet18", pretrained=True),
            "model.pretrained=true needs a 2-D",
        ),
        (
            dict(network="flexible_unet", backbone="resnet18", features=[8, 8]),
            "model.features for flexible_unet needs 5 decoder widths",
        ),
        (dict(network="segresnet", norm="layer"), "model.norm must be one of"),
        (
            dict(network="swin_unetr", features=[16]),
            "model.features for swin_unetr is [feature_size], a multiple of 12",
        ),
        (dict(network="unet3"), "unknown model.network 'unet3'"),
        (dict(spatial_dims=4), "model.spatial_dims must be 2 or 3"),
    ]
    for kw, msg in bad:
        with pytest.raises(ValueError, match="^" + re.escape(msg)) as e:
            SegmentationModule(**kw)
        assert "\n" not in str(e.value)
    # einops is a dependency (SwinUNETR's tests below need it); an install without it is told in one line
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "einops" else find_spec(n, *a)
    )
    with pytest.raises(ValueError, match="^model.network=swin_unetr needs the einops package"):
        SegmentationModule(network="swin_unetr")


@pytest.mark.parametrize("model", ["segresnet", "swin_unetr", "flexible_unet"])
def test_the_acdc_recipe_takes_each_model_group_with_its_own_channels_and_classes(model):
    from hydra.utils import instantiate

    from robusttrain.cli.compose import compose_recipe

    cfg = compose_recipe("acdc", [f"model={model}"])
    assert (cfg.model.network, cfg.model.in_channels, cfg.model.num_classes) == (model, 1, 4)
    small = {"segresnet": [8], "swin_unetr": [12], "flexible_unet": list(TINY_DECODER)}[model]
    net = instantiate(cfg.model, features=small)
    assert net(torch.rand(2, 1, 64, 64)).shape == (2, 4, 64, 64)


def test_pretrained_offline_is_one_line_naming_the_key(monkeypatch):
    import monai.networks.nets.efficientnet as effnet

    def offline(*a, **k):  # what torch's downloader raises without a network; never downloads
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(effnet.model_zoo, "load_url", offline)
    with pytest.raises(ValueError, match=r"^model\.pretrained=true could not fetch the efficientnet-b0"):
        build_network(
            "flexible_unet", 3, 2, backbone="efficientnet-b0", pretrained=True, features=TINY_DECODER
        )


# ----------------------------------------------------------------------------- the callbacks on BN models
class Volumes(Dataset):
    """(1,H,W,D) volumes: a bright box (label 1) in noise; a case per volume."""

    def __init__(self, n=4, size=(32, 32, 8), seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = 0.2 + 0.2 * torch.rand(n, 1, *size, generator=g)
        self.m = torch.zeros(n, *size, dtype=torch.long)
        for i in range(n):
            r = 4 + 3 * i
            self.m[i, r : r + 12, 6:20, 2:6] = 1
        self.x[:, 0][self.m.bool()] += 0.5

    def __len__(self):
        return len(self.x)

    def case_ids(self):
        return [f"vol{i}" for i in range(len(self))]

    def __getitem__(self, i):
        return {"image": self.x[i], "mask": self.m[i], "case_id": f"vol{i}", "slice_index": 0}


class EvalForwards:
    """Counts the module's forwards in eval mode (the callbacks' scoring and checks)."""

    def __init__(self):
        self.n = 0

    def __call__(self, module, args):
        self.n += not module.training


class Spy(L.Callback):
    """BN statistics, module modes and the count of eval-mode forwards where the callbacks score; one spy
    before every other callback, one after, so each pair brackets what the others did in that hook."""

    def __init__(self, counter: EvalForwards, attach: bool = False):
        self.seen: list[tuple[str, dict, list[bool], int]] = []
        self.counter, self.attach = counter, attach

    def setup(self, trainer, pl_module, stage):
        if self.attach:
            pl_module.register_forward_pre_hook(self.counter)

    def _snap(self, where, pl_module):
        self.seen.append((where, bn_buffers(pl_module), modes(pl_module), self.counter.n))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._snap("train_batch_start", pl_module)

    def on_validation_epoch_end(self, trainer, pl_module):
        self._snap("validation_epoch_end", pl_module)


MODELS = {
    "flexible_unet-efficientnet-b0": dict(network="flexible_unet", backbone="efficientnet-b0"),
    "flexible_unet-resnet10": dict(network="flexible_unet", backbone="resnet10"),
    "lite0_unet-pretrained": dict(network="lite0_unet", pretrained=True),
    "segresnet-batch": dict(network="segresnet", features=[8], norm="batch"),
    "segresnet-3d-batch": dict(
        network="segresnet", features=[8], norm="batch", spatial_dims=3, in_channels=1
    ),
    "swin_unetr-batch": dict(network="swin_unetr", features=[12], norm="batch"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_checks_and_scoring_never_move_batchnorm_statistics(tmp_path, name):
    fit_with_spies(tmp_path, name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_in_bf16_checks_and_scoring_never_move_batchnorm_statistics(tmp_path):
    fit_with_spies(tmp_path, "flexible_unet-efficientnet-b0", accelerator="gpu", precision="bf16-mixed")


def fit_with_spies(tmp_path, name: str, accelerator: str = "cpu", precision: str = "32-true") -> None:
    """A real 1-epoch fit with the MR check, worst-of-2 training and BalancedCheckpoint between two spies."""
    kw = dict(MODELS[name])
    kw.setdefault("features", TINY_DECODER)
    torch.manual_seed(0)
    model = SegmentationModule(num_classes=2, class_names=["fg"], lr=1e-3, **kw)
    three_d = kw.get("spatial_dims") == 3
    train = Volumes(4) if three_d else Blobs(8, size=64)
    val = Volumes(4, seed=1) if three_d else Blobs(4, size=64, seed=1)
    fams = ["contrast", "blur"]
    counter = EvalForwards()
    before, after = Spy(counter, attach=True), Spy(counter)
    callbacks = [
        before,
        MetamorphicCallback(suite=MRSuite(fams, (2,)), dirpath=str(tmp_path), batch_size=4),
        MetamorphicTraining(perturbations=fams, k=2, q=0.5, dirpath=str(tmp_path)),
        BalancedCheckpoint(dirpath=str(tmp_path)),
        after,
    ]
    start = bn_buffers(model)
    quiet_trainer(
        max_epochs=1,
        callbacks=callbacks,
        accelerator=accelerator,
        precision=precision,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
        devices="auto",
    ).fit(model, DataLoader(train, batch_size=4), DataLoader(val, batch_size=4))

    assert [s[0] for s in before.seen] == ["train_batch_start"] * (len(train) // 4) + ["validation_epoch_end"]
    for (where, bn0, modes0, n0), (where1, bn1, modes1, n1) in zip(before.seen, after.seen):
        assert where == where1
        assert n1 > n0, f"{where}: the callbacks scored nothing in eval mode"  # the worst-of-2 / the MR check
        assert same(bn0, bn1), f"{name}: {where} changed BatchNorm statistics"
        assert modes0 == modes1, f"{name}: {where} left a module in another mode"
    assert bn_buffers(model).keys() == start.keys() and not same(bn_buffers(model), start)  # training does
    efr = pd.read_csv(tmp_path / "efr.csv")
    assert set(efr.perturbation) >= set(fams)


# ----------------------------------------------------------------------------- precision, compile, the GPU recipe
def _cli_fit(tmp_path, recipe: str, *overrides: str) -> pd.DataFrame:
    from robusttrain.cli import main

    run_dir = tmp_path / "run"
    code = main(
        ["fit", f"recipe={recipe}", f"run_dir={run_dir}", "trainer.enable_progress_bar=false", *overrides]
    )
    assert code == 0
    metrics = pd.read_csv(run_dir / "logs" / "metrics.csv")
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "efr.csv").is_file()
    return metrics


@pytest.mark.slow
def test_polyp_gpu_recipe_builds_and_trains_a_step_on_cpu_in_bf16(tmp_path):
    from robusttrain.cli.compose import compose_recipe

    cfg = compose_recipe("polyp_gpu", [])
    assert (cfg.data.image_size, cfg.data.batch_size, cfg.model.network, cfg.model.backbone) == (
        352,
        16,
        "flexible_unet",
        "efficientnet-b0",
    )
    assert cfg.model.pretrained is True and cfg.trainer.precision == "bf16-mixed" and cfg.data.num_workers > 0
    assert set(cfg.callbacks) == set(compose_recipe("polyp", []).callbacks)  # the same robustness callbacks
    metrics = _cli_fit(
        tmp_path,
        "polyp_gpu",
        "model.pretrained=false",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "data.image_size=64",
        "data.batch_size=4",
        "data.n_train=4",
        "data.n_val=4",
        "data.num_workers=0",
        "model.features=[32,16,16,8,8]",
        "callbacks.metamorphic.suite.perturbations=[contrast,blur]",
        "callbacks.metamorphic.suite.severities=[2]",
        "trainer.log_every_n_steps=1",
    )
    assert "precision: bf16-mixed" in (tmp_path / "run" / "config.yaml").read_text()
    dice = metrics["val/dice"].dropna()
    assert len(dice) >= 1 and all(math.isfinite(d) for d in dice)
    assert math.isfinite(metrics["train/loss"].dropna().iloc[-1])


@pytest.mark.slow
def test_a_checkpoint_to_load_builds_without_downloading(tmp_path, monkeypatch):
    """validate / check / resume of a pretrained recipe take the weights from the checkpoint, offline."""
    import monai.networks.nets.efficientnet as effnet
    from omegaconf import OmegaConf

    from robusttrain.cli.build import _without_download
    from robusttrain.cli.compose import compose_recipe

    monkeypatch.setattr(effnet.model_zoo, "load_url", lambda *a, **k: pytest.fail("downloaded"))
    cfg = compose_recipe("polyp_gpu", ["ckpt=/some/last.ckpt"])
    node = _without_download(cfg)
    assert node.pretrained is False and cfg.model.pretrained is True  # the recorded config is the user's
    # everything else of the model node is the user's, as given
    rest = {k: v for k, v in OmegaConf.to_container(node).items() if k != "pretrained"}
    assert rest == {k: v for k, v in OmegaConf.to_container(cfg.model).items() if k != "pretrained"}
    assert _without_download(compose_recipe("polyp_gpu", [])).pretrained is True


@pytest.mark.slow
def test_a_torch_compiled_module_trains_with_every_recipe_callback(tmp_path):
    from robusttrain.cli.build import build_run
    from robusttrain.cli.compose import compose_recipe

    cfg = compose_recipe(
        "smoke",
        [
            f"run_dir={tmp_path / 'run'}",
            "trainer.max_epochs=1",
            "trainer.enable_progress_bar=false",
            "trainer.accelerator=cpu",
            "data.n_train=8",
            "data.n_val=4",
            "data.image_size=32",
            "callbacks.metamorphic.suite.perturbations=[contrast]",
            "callbacks.metamorphic.max_cases=2",
            "callbacks.mining.enabled=false",
        ],
    )
    run = build_run(cfg)
    names = {type(c).__name__ for c in run.callbacks}
    assert {"MetamorphicCallback", "MetamorphicTraining", "BalancedCheckpoint", "BalancedAverage"} <= names
    # The network is compiled, as a user does it (`model.net = torch.compile(model.net)`): compiling the
    # whole LightningModule makes Lightning compile training_step, whose self.log fails inside dynamo with
    # Lightning 2.6.6 + torch 2.13 (InternalTorchDynamoError in Lightning's own inspect.getfullargspec call).
    # aot_eager: dynamo's tracing, guards and recompiles (train/eval mode, no_grad, the scorer's half-size
    # batches: where callbacks meet a compiled module) and AOTAutograd, without inductor's C++ codegen,
    # which takes minutes of CPU per graph here; a GPU user's default (inductor) differs only in the kernels
    torch._dynamo.reset()
    run.model.net = torch.compile(run.model.net, backend="aot_eager")
    run.trainer.fit(run.model, datamodule=run.datamodule)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # something was compiled
    metrics = pd.read_csv(tmp_path / "run" / "logs" / "metrics.csv")
    assert math.isfinite(metrics["val/dice"].dropna().iloc[-1])
    assert (tmp_path / "run" / "efr.csv").is_file()
