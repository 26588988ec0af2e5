"""RunCheckpoint: Lightning's ModelCheckpoint whose resume follows its run directory when it moves.

Lightning's ModelCheckpoint saves its ``dirpath`` and the absolute paths of its files in every
checkpoint. Resumed from another folder (the run directory moved or copied: ``mv A B``, ``cp -a``),
it drops what it tracked: the resume writes ``last-v1.ckpt`` beside ``last.ckpt`` (which stays at the
old epoch), and top-k files it no longer knows are never replaced. RunCheckpoint maps the saved
paths to the same names in its own ``dirpath``, keeping only files that are there: a moved run goes
on exactly as if it had not moved. A path of the state that points outside ``dirpath`` is never
tracked (a crafted checkpoint could otherwise make it delete any file as a top-k "older" one).

Its state key is ModelCheckpoint's, so checkpoints written with either class resume with the other.

>>> import tempfile, pathlib
>>> new = pathlib.Path(tempfile.mkdtemp())
>>> _ = (new / "last.ckpt").write_bytes(b"x"); _ = (new / "epoch001.ckpt").write_bytes(b"x")
>>> state = {"dirpath": "/old/run/checkpoints", "last_model_path": "/old/run/checkpoints/last.ckpt",
...          "best_model_path": "/old/run/checkpoints/epoch001.ckpt", "best_model_score": 0.5,
...          "kth_best_model_path": "/old/run/checkpoints/epoch001.ckpt",
...          "best_k_models": {"/old/run/checkpoints/epoch001.ckpt": 0.5, "/etc/passwd": 0.1}}
>>> moved = relocated(state, new)
>>> moved["last_model_path"] == str(new / "last.ckpt"), list(moved["best_k_models"]) == [str(new / "epoch001.ckpt")]
(True, True)
>>> RunCheckpoint(dirpath=str(new), monitor="val/loss").state_key
"ModelCheckpoint{'monitor': 'val/loss', 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")


def relocated(state: dict[str, Any], dirpath: str | os.PathLike) -> dict[str, Any]:
    """``state`` (ModelCheckpoint's) with its paths mapped into ``dirpath``: each saved path becomes
    ``dirpath/<its file name>`` when that is a file there (else ``""`` / left out of ``best_k_models``)."""
    folder = Path(dirpath)
    saved = state.get("dirpath")

    def own(path: Any) -> str:
        if not isinstance(path, str) or not path:
            return ""
        p = Path(path)
        # only names the folder held when the state was saved (or holds now): never a path elsewhere
        if not (isinstance(saved, str) and p.parent == Path(saved)) and p.parent != folder:
            return ""
        mapped = folder / p.name
        return str(mapped) if mapped.is_file() and not mapped.is_symlink() else ""

    out = dict(state, dirpath=str(folder))
    for key in PATHS:
        if key in state:
            out[key] = own(state[key])
    models = state.get("best_k_models")
    if isinstance(models, dict):
        out["best_k_models"] = {own(k): v for k, v in models.items() if own(k)}
    return out


class RunCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that follows its run directory when it moves (see the module doc); the recipes'
    ``callbacks.checkpoint``. Arguments are ModelCheckpoint's."""

    @property
    @override
    def state_key(self) -> str:
        # ModelCheckpoint's own key, so a run saved by either class resumes with the other
        return super().state_key.replace(type(self).__qualname__, "ModelCheckpoint", 1)

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.dirpath is None:  # no folder of its own yet: Lightning's behaviour
            super().load_state_dict(state_dict)
            return
        saved = state_dict.get("dirpath")
        if isinstance(saved, str) and Path(saved) != Path(self.dirpath):
            rank_zero_info(
                f"robusttrain: the checkpoints were saved in {saved}; this run's are in {self.dirpath} "
                "(the run directory moved or was copied): the resume goes on with the files there"
            )
        super().load_state_dict(relocated(state_dict, self.dirpath))
