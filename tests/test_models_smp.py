"""``model=smp_unet`` (issue 43, item 2): segmentation-models-pytorch / timm encoders, an optional extra.

The extra's packages are installed apart from the venv (``make install``: ``.venv/smp-extra``, or
``ROBUSTTRAIN_SMP_EXTRA``) and used only in subprocesses here: the registry's torchvision is a CUDA build
that imports only through robusttrain/_torchvision.py, which the rest of the suite must not lean on.
Nothing downloads: ``HF_HUB_OFFLINE=1`` and an empty or hand-filled ``HF_HOME`` in every subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from robusttrain.cli import main

REPO = Path(__file__).resolve().parents[1]
EXTRA = Path(os.environ.get("ROBUSTTRAIN_SMP_EXTRA", REPO / ".venv" / "smp-extra"))
TINY = [
    "recipe=polyp", "model=smp_unet", "model.backbone=resnet18", "model.features=[16,8,8,8,8]",
    "data.image_size=64", "data.n_train=8", "data.n_val=4", "data.batch_size=4",
    "trainer.enable_progress_bar=false", "callbacks.metamorphic.suite.perturbations=[contrast,blur]",
    "callbacks.metamorphic.suite.severities=[2]",
]  # fmt: skip
needs_extra = pytest.mark.skipif(
    not (EXTRA / "segmentation_models_pytorch").is_dir(),
    reason=f"the smp extra is not installed at {EXTRA} (make install puts it there)",
)


def test_without_the_extra_smp_unet_is_one_line_naming_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "segmentation_models_pytorch", None)  # as if not installed
    from robusttrain.models.networks import build_network

    with pytest.raises(
        ValueError, match=r"needs segmentation-models-pytorch .*pip install 'robusttrain\[smp\]'"
    ):
        build_network("smp_unet", 3, 2)
    assert main(["fit", *TINY, f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error:" in line] == [
        line for line in err.splitlines() if "pip install 'robusttrain[smp]'" in line
    ]
    assert "Traceback" not in err and not (tmp_path / "run" / "checkpoints").exists()


def test_pretrained_must_be_a_bool_outside_smp_unet():
    from robusttrain.models.networks import build_network

    with pytest.raises(ValueError, match="model.pretrained must be true or false .*got 'imagenet'"):
        build_network("lite0_unet", 3, 2, pretrained="imagenet")


def _python(script: str, tmp_path: Path, *, hf_home: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), str(EXTRA)]), HF_HUB_OFFLINE="1",
        HF_HOME=str(hf_home or tmp_path / "hf_empty"), WANDB_MODE="disabled", OMP_NUM_THREADS="1",
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


@needs_extra
def test_torchvision_workaround_runs_only_when_the_plain_import_fails_and_says_so_once(tmp_path):
    plain = _python("import torchvision", tmp_path)
    out = _python(
        """
        import warnings
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            import robusttrain, lightning, segmentation_models_pytorch
            import robusttrain.cli
        said = [str(w.message) for w in seen if "torchvision::nms" in str(w.message)]
        print("SAID", len(said))
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    if plain.returncode == 0:  # a torchvision built for this torch: nothing to work around
        assert "SAID 0" in out.stdout
    else:
        assert "torchvision::nms does not exist" in plain.stderr  # the failure the workaround is for
        assert "SAID 1" in out.stdout


@needs_extra
def test_bad_smp_values_are_one_line_each_before_anything_downloads(tmp_path):
    out = _python(
        """
        from robusttrain.models.networks import build_network
        cases = [
            dict(backbone="resnet35"), dict(backbone="tu-convnext_tinyy"),
            dict(backbone="resnet18", pretrained="ssl2"), dict(backbone="tu-resnet18", pretrained="imagenet"),
            dict(backbone="resnet18", pretrained=True), dict(backbone="resnet18", features=[8, 8]),
            dict(backbone="resnet18", norm="group"), dict(backbone="resnet18", dropout=0.2),
        ]
        for kw in cases:
            try:
                build_network("smp_unet", 3, 2, **kw)
                print("BUILT", kw)
            except ValueError as e:
                assert "\\n" not in str(e)
                print("ERR", e)
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    errs = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert "BUILT" not in out.stdout and len(errs) == 8, out.stdout
    assert "'resnet35' is not an encoder of segmentation-models-pytorch (close: " in errs[0]
    assert "timm has no model 'convnext_tinyy' (close: tu-convnext_tiny" in errs[1]
    assert "resnet18 has weights imagenet, ssl, swsl" in errs[2]
    assert "a timm encoder takes true or false" in errs[3]
    assert "the resnet18 weights could not be loaded (LocalEntryNotFoundError" in errs[4]
    assert "set model.pretrained=false" in errs[4]
    assert (
        "5 decoder widths" in errs[5] and "batch or instance" in errs[6] and "no decoder dropout" in errs[7]
    )


def _fill_cache(tmp_path: Path) -> Path:
    """A Hugging Face cache holding smp's resnet18 ImageNet entry (at smp's pinned revision) with a seeded
    random state dict: what a first fit with internet leaves behind, minus the real numbers."""
    hf = tmp_path / "hf"
    out = _python(
        f"""
        import json, torch
        from pathlib import Path
        from safetensors.torch import save_file
        import robusttrain  # first: it lets the registry's torchvision import
        import segmentation_models_pytorch as smp
        s = smp.encoders.encoders["resnet18"]["pretrained_settings"]["imagenet"]
        snap = Path({str(hf)!r}) / "hub" / ("models--" + s["repo_id"].replace("/", "--")) / "snapshots" / s["revision"]
        snap.mkdir(parents=True)
        torch.manual_seed(7)
        enc = smp.encoders.get_encoder("resnet18", weights=None)
        save_file({{k: v.contiguous() for k, v in enc.state_dict().items()}}, str(snap / "model.safetensors"))
        (snap / "config.json").write_text(json.dumps({{"input_space": "RGB", "input_range": [0, 1]}}))
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return hf


@needs_extra
@pytest.mark.slow
def test_a_fit_starts_from_the_cached_encoder_weights_records_them_and_check_reads_its_run(tmp_path):
    hf = _fill_cache(tmp_path)
    run = tmp_path / "run"
    out = _python(
        f"""
        import hashlib, torch
        from pathlib import Path
        from safetensors.torch import load_file
        from robusttrain.cli import main
        from robusttrain.models import SegmentationModule
        tiny = {TINY!r}
        m = SegmentationModule(network="smp_unet", backbone="resnet18", pretrained=True, features=[16, 8, 8, 8, 8])
        file = next(Path({str(hf)!r}).rglob("model.safetensors"))
        cached = load_file(str(file))
        enc = m.net.net.encoder.state_dict()
        assert all(torch.equal(enc[k], v) for k, v in cached.items()), "not the cached weights"
        assert m.pretrained_weights["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
        assert [g["name"] for g in m.param_groups()] == ["all"]  # encoder_lr_mult 1 here
        assert main(["fit", "trainer.max_epochs=1", *tiny, "run_dir={run}"]) == 0
        assert main(["check", *tiny, "ckpt={run}/checkpoints/last.ckpt"]) == 0
        print("SHA", m.pretrained_weights["sha256"])
        """,
        tmp_path,
        hf_home=hf,
    )
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    sha = out.stdout.split("SHA ")[1].split()[0]
    record = json.loads((run / "pretrained.json").read_text())
    assert (
        record["network"] == "smp_unet" and record["sha256"] == sha and record["file"] == "model.safetensors"
    )
    assert f"pretrained weights: model.safetensors (sha256 {sha})" in out.stdout
    assert (run / "checks" / "last-val" / "efr_table.csv").is_file()
    config = (run / "config.yaml").read_text()
    assert "encoder_lr_mult: 0.1" in config and "network: smp_unet" in config


@needs_extra
def test_offline_without_cached_weights_a_fit_stops_in_one_line_before_training(tmp_path):
    run = tmp_path / "run"
    out = _python(
        f"""
        import sys
        from robusttrain.cli import main
        sys.exit(main(["fit", *{TINY!r}, "run_dir={run}"]))
        """,
        tmp_path,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "model.pretrained=True: the resnet18 weights could not be loaded" in errors[0]
    assert "Traceback" not in out.stderr and not (run / "checkpoints").exists()
