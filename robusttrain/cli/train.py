"""``fit``, ``validate`` and ``test``: compose, build, run, report the run directory and Dice."""

from __future__ import annotations

import contextlib
import os
import re
import traceback
from pathlib import Path

from omegaconf import DictConfig

from robusttrain.checkpoints import check_file, check_fits, load_checkpoint
from robusttrain.cli.build import build_run, write_config
from robusttrain.cli.claim import prepare_fresh_fit, starts_clean
from robusttrain.cli.errors import UsageError
from robusttrain.cli.resume import check_resume, record_resume, run_config
from robusttrain.errors import InputError


def _resolve_ckpt(ckpt: str | Path, run_dir: Path | None) -> Path:
    """``ckpt=PATH`` or ``ckpt=last`` (``<run_dir>/checkpoints/last.ckpt``) -> an existing, non-empty file."""
    if ckpt == "last":
        assert run_dir is not None  # ckpt=last is resolved once the run directory is known
        path = run_dir / "checkpoints" / "last.ckpt"
        newest = _newest_last(path.parent)
        if newest is None:
            raise UsageError(
                f"checkpoint not found: ckpt=last -> '{path}' (no fit has saved a checkpoint "
                "in this run_dir yet)"
            )
        if newest != path:
            _say(
                f"[robusttrain] ckpt=last: {newest.name} holds a later epoch than last.ckpt; resuming from it"
            )
        return check_file(newest)
    if not Path(ckpt).expanduser().exists():
        raise UsageError(f"checkpoint not found: ckpt={ckpt} -> '{Path(ckpt).expanduser()}'")
    return check_file(ckpt)


LAST = re.compile(r"last(-v\d+)?\.ckpt")  # Lightning's names for the last checkpoint (-vN: a copy beside it)


def _newest_last(folder: Path) -> Path | None:
    """The ``last*.ckpt`` of ``folder`` with the latest epoch and step (``last.ckpt`` on a tie), None if none.

    A resume that Lightning's ModelCheckpoint could not match to its folder (a run directory moved
    before RunCheckpoint) saved its later epochs as ``last-v1.ckpt``: ``ckpt=last`` goes on from those."""
    from robusttrain.checkpoints import checkpoint_progress

    found = [p for p in folder.glob("last*.ckpt") if LAST.fullmatch(p.name) and p.is_file()]
    if not found:
        return None
    return max(found, key=lambda p: (checkpoint_progress(p), p.name == "last.ckpt"))


def _dice_line(metrics: dict, prefix: str) -> str:
    """The headline Dice (per case, mean over cases: the number history.csv, check and the report show)
    first, labelled, then the other Dice keys; the pooled Dice labelled as what it is."""
    head = f"{prefix}/dice"
    if head not in metrics:
        return f"{prefix} Dice: not computed"
    cases = metrics.get(f"{prefix}/cases")
    line = f"{head}={float(metrics[head]):.4f}" + (
        f" (per-case Dice, mean over {int(cases)} cases)" if cases is not None else ""
    )
    rest = sorted(k for k in metrics if k.startswith(f"{prefix}/dice_") and k != head)
    for k in rest:
        line += f"  {k}={float(metrics[k]):.4f}"
        if k == f"{prefix}/dice_pooled":
            line += " (one Dice over every pixel of the set)"
    return line


def _say(text: str) -> None:
    """Print once per run: DDP re-runs the command for the other ranks (LOCAL_RANK > 0)."""
    if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0":
        print(text, flush=True)


def run_stage(stage: str, cfg: DictConfig, overwrite: bool = False, split: str = "all") -> int:
    """Run ``fit``/``validate``/``test``. ``overwrite``: a fresh fit may replace a run directory's files.

    ``validate``/``test`` load only the checkpoint's weights into the recipe's model: evaluating is not
    resuming, so the training run's callback states (its MR suite, bank, ...) are neither needed nor checked.
    With ``data.root`` they score every case of the folder (``split="all"``) or its validation split
    (``split="val"``), and say how many cases the Dice rests on.
    """
    ckpt: str | Path | None = str(cfg.get("ckpt")) if cfg.get("ckpt") not in (None, "") else None
    if stage != "fit" and ckpt is None:
        raise UsageError(f"{stage} needs ckpt=PATH (a .ckpt file written by fit)")
    state = None
    if ckpt is not None and ckpt != "last":
        ckpt = _resolve_ckpt(ckpt, None)  # before anything is built or written
        state = load_checkpoint(ckpt)
    run = build_run(cfg, command=stage, write=False)
    _say(f"[robusttrain] {stage} recipe={cfg.recipe} run_dir={run.run_dir}")
    resume_last = ckpt == "last"
    if resume_last and stage == "fit" and starts_clean(run.run_dir):
        ckpt, resume_last = None, False  # killed before its first last.ckpt: nothing to resume
    if resume_last:
        assert ckpt is not None
        ckpt = _resolve_ckpt(ckpt, run.run_dir)
        state = load_checkpoint(ckpt)
    if ckpt is not None:
        # Weights only, and they must fit this recipe's model -- checked before Lightning starts
        # (Lightning then reads the file through the same loader: robusttrain.checkpoints.checkpoint_io).
        assert state is not None  # loaded with every resolved ckpt above
        check_fits(Path(ckpt), state["state_dict"], run.model)
        if stage == "fit":
            with _restoring(ckpt):
                _check_callback_states(run.trainer, state)
    resuming = stage == "fit" and ckpt is not None and run_config(run.run_dir) is not None
    # a resume keeps the run's config.yaml; it may change only a few settings (cli/resume.py)
    changed = check_resume(run.run_dir, cfg) if resuming else []
    if stage == "fit" and ckpt is None:
        prepare_fresh_fit(run.run_dir, overwrite)
    # every check passed: only now is anything in the run directory changed
    if not resuming:
        write_config(cfg, run.run_dir, stage)
    if stage == "fit" and ckpt is None:
        _record_weights(run)
    if ckpt is not None:
        assert state is not None
        if stage == "fit":
            epoch = int(state.get("epoch", -1))
            record_resume(run.run_dir, changed, Path(ckpt), epoch)
            _forget_epochs_after(run.trainer, Path(ckpt), epoch, resume_last)
        ckpt = str(ckpt)
    trainer = run.trainer
    assert trainer is not None  # build_run(with_trainer=True)
    if stage == "fit":
        with _restoring(ckpt):
            trainer.fit(run.model, datamodule=run.datamodule, ckpt_path=ckpt, weights_only=True)
        metrics = dict(trainer.callback_metrics)
        _say(f"[robusttrain] final validation {_dice_line(metrics, 'val')}")
    else:
        assert state is not None  # validate / test need ckpt=PATH
        run.model.load_state_dict(state["state_dict"])
        what = _eval_split(run.datamodule, split)
        if stage == "validate":
            trainer.validate(run.model, datamodule=run.datamodule)
            _say(f"[robusttrain] validation {_dice_line(dict(trainer.callback_metrics), 'val')} ({what})")
        else:
            trainer.test(run.model, datamodule=run.datamodule)
            _say(f"[robusttrain] test {_dice_line(dict(trainer.callback_metrics), 'test')} ({what})")
    _say(f"[robusttrain] run_dir={run.run_dir}")
    return 0


def _record_weights(run) -> None:
    """A fresh fit whose network loaded pretrained weights it can name records them (``pretrained.json``)."""
    weights = getattr(run.model, "pretrained_weights", None)
    if weights:
        from robusttrain.rundir import pretrained

        pretrained.write(run.run_dir, str(run.cfg.model.get("network")), weights)
        _say(
            f"[robusttrain] pretrained weights: {weights['file']} (sha256 {weights['sha256']}), recorded in {pretrained.NAME}"
        )


def _eval_split(datamodule, split: str) -> str:
    """Point validate / test at ``split`` of a ``data.root`` folder; say how many cases they score."""
    if not hasattr(datamodule, "eval_split"):
        return "the datamodule's own loader"
    if getattr(datamodule, "root", None) is None:
        return f"{len(datamodule.val_dataloader().dataset)} cases: the validation split"
    datamodule.eval_split = split
    n = len(datamodule.val_dataloader().dataset)
    if split == "all":
        return f"{n} cases: every case of data.root; add split=val to score only its validation split"
    return f"{n} cases: the validation split of data.root"


RESTORE_FRAMES = {
    "check_resume",
    "restore_callbacks",
    "restore_datamodule",
    "restore_training_state",
    "_restore_modules_and_callbacks",
    "restore_loops",
    "_check_callback_states",
    "_apply_resume_state",
}  # the datamodule applies its restored RNG state lazily


@contextlib.contextmanager
def _restoring(ckpt):
    """A checkpoint's saved training state that does not fit what restores it (a crafted or foreign
    file: a string where a mapping is expected) is the checkpoint's fault: one line naming the file.
    Only errors raised while restoring count; the same error types later in training stay bugs."""
    try:
        yield
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        if ckpt is None or isinstance(e, InputError):
            raise
        frames = {f.name for f in traceback.extract_tb(e.__traceback__)}
        if not frames & RESTORE_FRAMES:
            raise
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UsageError(
            f"checkpoint '{ckpt}': its saved training state cannot be restored ({type(e).__name__}"
            f"{': ' + text if text else ''}); resume from a checkpoint this recipe's fit wrote"
        ) from None


def _check_callback_states(trainer, state: dict) -> None:
    """Callbacks that can refuse a checkpoint's state (``check_resume``) do so before anything is written."""
    saved = state.get("callbacks") or {}
    for cb in trainer.callbacks:
        if hasattr(cb, "check_resume") and cb.state_key in saved:
            cb.check_resume(saved[cb.state_key])


def _forget_epochs_after(trainer, ckpt: Path, epoch: int, killed_run: bool) -> None:
    """A resumed fit runs the epochs after its checkpoint again. What the stopped run wrote for them
    goes: logged rows (loggers that can drop them do) and, resuming ``ckpt=last`` (a killed run),
    checkpoints saved after it (kept, they would sit beside the re-run's own as ``-v1`` copies that
    no ModelCheckpoint tracks). Resuming from an explicit older file keeps later checkpoints."""
    from robusttrain.checkpoints import checkpoint_epoch

    for logger in trainer.loggers:
        if hasattr(logger, "resume_after"):
            logger.resume_after(epoch)
    for cb in trainer.checkpoint_callbacks if killed_run else []:
        folder = Path(getattr(cb, "dirpath", None) or "")
        if not folder.is_dir():
            continue
        for p in folder.glob("*.ckpt"):
            if p.resolve() != ckpt.resolve() and (e := checkpoint_epoch(p)) is not None and e > epoch:
                p.unlink()
                _say(f"[robusttrain] removed {p.name}: saved at epoch {e}, after the checkpoint resumed from")
