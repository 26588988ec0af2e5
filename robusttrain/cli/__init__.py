"""Command line: ``python -m robusttrain <command> recipe=NAME [key=value ...]``.

Each command composes a recipe with Hydra and hands off to library code; errors the user can
fix (bad recipe, key, value, path) are printed as one line with exit code 2.
"""
from __future__ import annotations

import os
import sys
from typing import Callable

from robusttrain.cli.errors import UsageError

USAGE = """usage: python -m robusttrain <command> [recipe=NAME] [key=value ...]

commands:
  fit        train a recipe                        fit recipe=polyp [data.root=PATH] [ckpt=last]
  validate   validate a checkpoint                 validate recipe=polyp ckpt=PATH
  test       test a checkpoint                     test recipe=polyp ckpt=PATH
  check      metamorphic robustness audit          check recipe=polyp ckpt=PATH [data.root=PATH]
  corners    corner-case report of a run           corners RUN_DIR_OR_HISTORY_CSV [policy=last_inlier|maximin|pareto|cvar]
  gallery    render the perturbation gallery       gallery [recipe=polyp] [out=gallery.png] [n=2] [tile=192] [colors=256]
  report     self-contained HTML report of a run   report RUN_DIR

recipes: {recipes}
Overrides use Hydra syntax (data.batch_size=4, logger=wandb, callbacks.metamorphic.enabled=false).
"""


def _split(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    """(recipe, overrides, positional) from raw args."""
    recipe, overrides, positional = None, [], []
    for a in argv:
        if a.startswith("recipe="):
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
        return run_stage(name, compose_recipe(recipe, overrides))
    return run


def _tool(name: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        from robusttrain.cli import tools

        return getattr(tools, name)(*_split(argv))
    return run


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "fit": _stage("fit"), "validate": _stage("validate"), "test": _stage("test"),
    "check": _tool("check"), "corners": _tool("corners"), "gallery": _tool("gallery"),
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
        print(f"robusttrain: unknown command '{command}'; valid commands: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    if any(a in ("-h", "--help") for a in rest):
        print(usage())
        return 0
    # W&B never reaches for the network unless the user asks for it (WANDB_MODE=online).
    os.environ.setdefault("WANDB_MODE", "offline")
    from robusttrain.checkpoints import CheckpointError
    from robusttrain.cli.rundir import release_all
    from robusttrain.errors import InputError  # DataError, HookError, NonFiniteOutputError, ...

    try:
        return COMMANDS[command](rest)
    except (UsageError, InputError, CheckpointError) as e:
        # Bad input the user can fix: one line, no traceback from deep inside torch.
        print(f"robusttrain {command}: error: {e}", file=sys.stderr)
        return 2
    finally:
        release_all()
