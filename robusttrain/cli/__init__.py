"""Command line: ``python -m robusttrain <command> recipe=NAME [key=value ...]``.

Each command composes a recipe with Hydra and hands off to library code. Every command runs inside
one error boundary (:mod:`robusttrain.cli.boundary`): errors the user can fix are one line with exit
code 2, refused file operations one line with exit code 3, Ctrl-C 130 and SIGTERM 143.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable

from robusttrain.cli.errors import UsageError

USAGE = """usage: python -m robusttrain <command> [recipe=NAME] [key=value ...]

commands:
  fit        train a recipe                        fit recipe=polyp [data.root=PATH] [ckpt=last]
  validate   validate a checkpoint                 validate recipe=polyp ckpt=PATH [data.root=PATH] [split=all|val]
  test       test a checkpoint                     test recipe=polyp ckpt=PATH [data.root=PATH] [split=all|val]
  check      metamorphic robustness audit          check recipe=polyp ckpt=PATH [heldout=FAMILIES] [data.root=PATH] [run_dir=RUN]
  corners    corner-case report of a run           corners RUN_DIR_OR_HISTORY_CSV [policy=last_inlier|maximin|pareto|cvar]
  gallery    render the perturbation gallery       gallery [recipe=polyp] [out=gallery.png] [n=2] [tile=192] [colors=256]
  report     self-contained HTML report of a run   report RUN_DIR

exit codes: 0 done, 2 bad input (one line names it), 3 file system refused (disk full, read-only,
permission, a file where a folder should be), 130 Ctrl-C, 143 SIGTERM (resume a fit with ckpt=last)

recipes: {recipes}
With data.root, validate / test / check score every case of the folder (split=val: its validation split).
`python -m robusttrain <command> --help` lists every key of a command.
Overrides use Hydra syntax (data.batch_size=4, logger=wandb, callbacks.metamorphic.enabled=false).
"""


def _split(argv: list[str], paths: bool = False) -> tuple[str | None, list[str], list[str]]:
    """(recipe, overrides, positional) from raw args; with ``paths``, an argument naming an existing
    file or folder is positional even when it contains ``=`` (Hydra sweep folders such as ``lr=0.01``)."""
    recipe, overrides, positional = None, [], []
    for a in argv:
        if paths and os.path.exists(a):
            positional.append(a)
        elif a.startswith("recipe="):
            recipe = a.split("=", 1)[1]
        elif "=" in a:
            overrides.append(a)
        else:
            positional.append(a)
    return recipe, overrides, positional


def _stage(name: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from robusttrain.cli.compose import compose_recipe
        from robusttrain.cli.train import run_stage

        recipe, overrides, positional = _split(argv)
        if positional:
            raise UsageError(f"unexpected argument '{positional[0]}' (expected key=value)")
        overwrite = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "overwrite"]
        if overwrite and (name != "fit" or overwrite[-1] not in ("true", "false")):
            raise UsageError(
                f"bad value for 'overwrite': {overwrite[-1]!r} (expected true/false, fit only)"
                if name == "fit"
                else f"overwrite= is for fit only, not {name}"
            )
        split = split_option(overrides, name)
        overrides = [o for o in overrides if o.split("=", 1)[0] not in ("overwrite", "split")]
        return run_stage(
            name,
            compose_recipe(recipe, overrides),
            overwrite=bool(overwrite) and overwrite[-1] == "true",
            split=split,
        )

    return run


SPLITS = ("all", "val")


def split_option(overrides: list[str], command: str) -> str:
    """``split=all|val`` of validate / test / check: with ``data.root`` they score the whole folder
    (``all``, the default) or only its validation split (``val``); fit takes no ``split=``."""
    given = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "split"]
    if not given:
        return "all"
    if command == "fit":
        raise UsageError("split= is for validate, test and check (what to score), not fit")
    if given[-1] not in SPLITS:
        raise UsageError(f"bad value for 'split': {given[-1]!r} (expected all or val)")
    return given[-1]


def _tool(name: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from robusttrain.cli import tools

        return getattr(tools, name)(*_split(argv, paths=name in ("corners", "report")))

    return run


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "fit": _stage("fit"),
    "validate": _stage("validate"),
    "test": _stage("test"),
    "check": _tool("check"),
    "corners": _tool("corners"),
    "gallery": _tool("gallery"),
    "report": _tool("report"),
}


def usage() -> str:
    from robusttrain.cli.compose import available_recipes

    return USAGE.format(recipes=", ".join(available_recipes()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"robusttrain: unknown command '{command}'; valid commands: {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    if any(a in ("-h", "--help") for a in rest):
        from robusttrain.cli.help import command_help

        print(command_help(command) or usage())
        return 0
    # W&B never reaches for the network unless the user asks for it (WANDB_MODE=online).
    os.environ.setdefault("WANDB_MODE", "offline")
    quiet_third_party()
    return _run_guarded(command, rest)


class _DropAdvert(logging.Filter):
    """Drops Lightning's "install litlogger" tip: an advert for a cloud service, nothing a user can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.msg)


def quiet_third_party() -> None:
    """What the CLI's console leaves out of the libraries' output (the library API leaves a user's own
    trainer as it is): Lightning's cloud-logger tip, and the deprecation warning that Lightning 2.6's own
    ``_pytree`` helper raises with the torch installed here (2.13) at every fit (``LeafSpec``), which only a
    Lightning release can fix.

    >>> quiet_third_party(); quiet_third_party()  # idempotent
    >>> sum(isinstance(f, _DropAdvert) for f in logging.getLogger(_RANK_ZERO_LOG).filters)
    1
    """
    log = logging.getLogger(_RANK_ZERO_LOG)
    if not any(isinstance(f, _DropAdvert) for f in log.filters):
        log.addFilter(_DropAdvert())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")


_RANK_ZERO_LOG = "lightning.pytorch.utilities.rank_zero"  # where Lightning's rank_zero_info logs


def _run_guarded(command: str, rest: list[str]) -> int:
    """The error boundary (see :mod:`robusttrain.cli.boundary`)."""
    from robusttrain.cli import boundary

    stopped = boundary.Stopped().install()

    def fail(text: str, code: int) -> int:
        print(f"robusttrain {command}: error: {_one_line(text)}", file=sys.stderr, flush=True)
        return code

    try:
        from robusttrain.checkpoints import CheckpointError
        from robusttrain.errors import InputError  # DataError, HookError, NonFiniteOutputError, ...

        try:
            return COMMANDS[command](rest)
        except (UsageError, InputError, CheckpointError) as e:
            # Bad input the user can fix: one line, no traceback from deep inside torch.
            return fail(str(e), boundary.EXIT_INPUT)
        except OSError as e:
            if not boundary.is_system_error(e):
                raise
            return fail(boundary.os_error_line(e), boundary.EXIT_SYSTEM)
        except MemoryError as e:
            return fail(
                f"out of memory ({e or 'MemoryError'}); use smaller inputs or batch sizes",
                boundary.EXIT_INPUT,
            )
    except (KeyboardInterrupt, SystemExit) as e:
        # Lightning turns the KeyboardInterrupt our signal handler raises into sys.exit(1) after its
        # graceful shutdown; a real SystemExit of another origin keeps its code
        if stopped.signal is None and not isinstance(e, KeyboardInterrupt):
            raise
        if stopped.signal is None:
            import signal

            stopped.signal = signal.SIGINT
        hint = "; resume with ckpt=last" if command == "fit" else ""
        return fail(f"stopped by {stopped.name()}{hint}", stopped.exit_code())
    finally:
        stopped.restore()
        from robusttrain.cli.claim import release_all

        release_all()


def _one_line(text: str) -> str:
    text = str(text).strip()
    return text.splitlines()[0] if text else "failed"
