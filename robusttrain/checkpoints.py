"""The one way robusttrain reads a checkpoint: weights only, validated, with errors that name the file.

A checkpoint is user-supplied input. ``torch.load(weights_only=False)`` would unpickle it, and a
pickle can run any code; so every checkpoint the CLI touches goes through :func:`load_checkpoint`
first: it must exist, be non-empty, load with ``weights_only=True`` (tensors and plain Python
values only), be a Lightning checkpoint (a ``state_dict``), and -- given a model -- have exactly the
model's parameter names and shapes. Anything else raises :class:`CheckpointError`, one line naming
the file, what is wrong with it and what was expected.

>>> import tempfile, torch
>>> model = torch.nn.Linear(2, 1)
>>> path = tempfile.mkdtemp() + "/m.ckpt"
>>> torch.save({"state_dict": model.state_dict(), "epoch": 0}, path)
>>> sorted(load_checkpoint(path, model)["state_dict"])
['bias', 'weight']
>>> load_checkpoint(path, torch.nn.Linear(3, 1))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
robusttrain.checkpoints.CheckpointError: checkpoint '...m.ckpt' does not fit Linear: shape of 'weight' is (1, 2) in the file, (1, 3) in the model...
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

EXPECTED = "a .ckpt file written by `robusttrain fit` (or Lightning) for this recipe's model"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, empty, corrupt, unsafe or for another model."""


def _fail(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint '{path}' {what}")


def check_file(path: str | os.PathLike) -> Path:
    """``path`` as an existing, non-empty regular file, else :class:`CheckpointError`."""
    p = Path(path).expanduser()
    if not p.exists():
        raise _fail(p, f"not found (expected {EXPECTED})")
    if not p.is_file():
        raise _fail(p, f"is a directory, not a file (expected {EXPECTED})")
    if p.stat().st_size == 0:
        raise _fail(p, f"is empty (0 bytes; a run killed while saving? expected {EXPECTED})")
    return p


def load_checkpoint(path: str | os.PathLike, model: Any = None) -> dict[str, Any]:
    """Load ``path`` with ``weights_only=True`` and validate it (see module doc); returns the dict.

    With ``model`` (an ``nn.Module``), the ``state_dict`` must have exactly its keys and shapes.
    """
    import torch

    p = check_file(path)
    with open(p, "rb") as fh:
        head = fh.read(4)
    if head[:2] != b"PK" and head[:1] != b"\x80":  # torch zip archive / legacy pickle
        raise _fail(p, f"is not a PyTorch checkpoint (unrecognised content; expected {EXPECTED})")
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" in str(e) or "GLOBAL" in str(e):
            raise _fail(
                p,
                "holds Python objects besides weights and was refused: loading it would run "
                f"code from the file (expected {EXPECTED}, which holds only tensors and "
                "plain values)",
            ) from None
        raise _fail(p, f"is corrupt ({_first_line(e)}; expected {EXPECTED})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise _fail(p, f"is truncated or corrupt ({_first_line(e)}; expected {EXPECTED})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        kind = (
            f"a dict with keys {sorted(map(str, ckpt))[:6]}"
            if isinstance(ckpt, dict)
            else type(ckpt).__name__
        )
        raise _fail(
            p, f"is not a Lightning checkpoint: it holds {kind}, no 'state_dict' (expected {EXPECTED})"
        )
    if model is not None:
        check_fits(p, ckpt["state_dict"], model, ckpt.get("hyper_parameters"))
    return ckpt


def check_fits(path: Path, state: dict[str, Any], model: Any, file_hparams: Any = None) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has exactly ``model``'s names and shapes; with the
    file's ``hyper_parameters`` (Lightning's), the error also names the model settings that differ."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = {k: tuple(getattr(v, "shape", ())) for k, v in state.items()}
    name = type(model).__name__
    missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    problem = None
    if missing or extra:
        parts = [
            f"{len(missing)} of the model's weights missing (e.g. '{missing[0]}')" if missing else "",
            f"{len(extra)} unknown weights (e.g. '{extra[0]}')" if extra else "",
        ]
        problem = (
            f"does not fit {name}: {', '.join(filter(None, parts))} -- written for another "
            "recipe or model? (expected a checkpoint of this recipe's model)"
        )
    else:
        k = next((k for k in want if want[k] != have[k]), None)
        if k is not None:
            problem = (
                f"does not fit {name}: shape of '{k}' is {have[k]} in the file, {want[k]} in "
                "the model -- written for another recipe or model settings? (expected a "
                "checkpoint of this recipe's model)"
            )
    if problem is not None:  # the settings hint is only worked out for a refusal
        raise _fail(path, problem + settings_hint(file_hparams, getattr(model, "hparams", None)))


def _shown(v: Any) -> str | None:
    """A hyper-parameter value read from a file, as text for one error line, or None when it is not a
    short plain value (the file is untrusted: nothing else is shown, nothing is ever built from it)."""
    if v is None or isinstance(v, (bool, int, float)):
        return repr(v)
    if isinstance(v, str) and 0 < len(v) <= 40 and all(c.isalnum() or c in "-_." for c in v):
        return v
    if isinstance(v, (list, tuple)) and len(v) <= 8 and all(type(x) is int for x in v):
        return "[" + ",".join(map(str, v)) + "]"
    return None


def settings_hint(file_hparams: Any, model_hparams: Any) -> str:
    """The model settings that differ between a checkpoint and the model it was loaded into, as command-line
    overrides (``model=<network>``, ``model.<key>=<value>``) for the end of an error line; '' when either
    side has none or none differ.

    >>> settings_hint({"network": "swin_unetr", "features": [12], "lr": 0.1}, {"network": "basic_unet",
    ...     "features": [8, 8, 16, 16, 32, 8], "lr": 0.1})
    '; the file was written with model=swin_unetr model.features=[12] (this model: basic_unet, [8,8,16,16,32,8])'
    """
    if not isinstance(file_hparams, dict) or model_hparams is None or not hasattr(model_hparams, "get"):
        return ""
    keys = ("network", "backbone", "features", "in_channels", "num_classes", "spatial_dims", "norm")
    diff = []
    for k in keys:
        if k not in file_hparams:
            continue
        mine, theirs = _shown(model_hparams.get(k)), _shown(file_hparams[k])
        if theirs is not None and mine != theirs:
            diff.append((k, theirs, mine))
    if not diff:
        return ""
    # the recipes' model groups are named after the networks: model=<network> brings that network's keys
    given = " ".join(f"model={v}" if k == "network" else f"model.{k}={v}" for k, v, _ in diff)
    return f"; the file was written with {given} (this model: {', '.join(str(m) for _, _, m in diff)})"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line.split(". ")[0][:160]


def checkpoint_io() -> Any:
    """Lightning ``CheckpointIO`` plugin: saves atomically next to the target, loads via :func:`load_checkpoint`.

    Lightning's own writer stages the file in the system temp folder and moves it over (a copy
    when that is another file system, so a kill can leave a torn ``last.ckpt``, and the staged copy
    stays in /tmp); its reader unpickles. The CLI passes this plugin to every trainer it builds.

    >>> import lightning as L
    >>> trainer = L.Trainer(plugins=[checkpoint_io()], logger=False)
    """
    import io

    import torch
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from robusttrain.io import atomic_write_bytes

    class SafeCheckpointIO(TorchCheckpointIO):
        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            buf = io.BytesIO()
            torch.save(checkpoint, buf)
            atomic_write_bytes(path, buf.getvalue())

        def load_checkpoint(
            self, path: Any, map_location: Any = None, weights_only: Any = None
        ) -> dict[str, Any]:
            return load_checkpoint(path)

    return SafeCheckpointIO()


def rng_state(generator: Any = None) -> dict[str, Any]:
    """Global RNG states (torch, CUDA, numpy, random) and ``generator``'s, as plain values and tensors
    (so a checkpoint holding them still loads with ``weights_only=True``).

    >>> import random
    >>> s = rng_state(); a = random.random(); set_rng_state(s); a == random.random()
    True
    """
    import random

    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    out = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, np.asarray(keys).tolist(), pos, has_gauss, gauss],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        out["generator"] = generator.get_state()
    return out


def set_rng_state(state: dict[str, Any], generator: Any = None) -> None:
    """Restore what :func:`rng_state` captured (``generator``'s state too, when given and saved)."""
    import random

    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])


def checkpoint_epoch(path: str | os.PathLike) -> int | None:
    """The ``epoch`` a checkpoint was saved at (weights-only, memory-mapped), None if unreadable."""
    epoch, _ = checkpoint_progress(path)
    return None if epoch < 0 else epoch


def checkpoint_progress(path: str | os.PathLike) -> tuple[int, int]:
    """``(epoch, global_step)`` a checkpoint was saved at (weights-only, memory-mapped); ``(-1, -1)``
    if unreadable, so any readable checkpoint sorts after it.

    >>> import tempfile, torch
    >>> path = tempfile.mkdtemp() + "/c.ckpt"
    >>> torch.save({"epoch": 2, "global_step": 12, "state_dict": {}}, path)
    >>> checkpoint_progress(path), checkpoint_progress(path + ".missing")
    ((2, 12), (-1, -1))
    """
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(ckpt["epoch"]), int(ckpt.get("global_step", 0))
    except Exception:  # noqa: BLE001 -- any unreadable file simply has no progress
        return -1, -1
