"""``python -m robusttrain <command> --help``: every key a user of that command needs, in one screen.

The lists of choices (recipes, models, loggers, callbacks) are read from the recipe folders, so the help
never names one that is not there.

>>> text = command_help("check")
>>> all(k in text for k in ("ckpt=", "heldout=", "run_dir=", "data.root=", "name=", "split="))
True
>>> command_help("nope") is None
True
>>> "record_every, record_per_step" in command_help("fit")   # read from MetamorphicTraining's settings
True
"""

from __future__ import annotations

import textwrap

from omegaconf import OmegaConf

from robusttrain.cli.compose import PACKAGE_RECIPES, available_recipes
from robusttrain.cli.settings_keys import settings_of


def _group(name: str) -> str:
    return "|".join(sorted(p.stem for p in (PACKAGE_RECIPES / name).glob("*.yaml")))


def _settings(callback: str) -> str:
    """The setting keys of a callback's recipe node, read from the class it builds."""
    node = OmegaConf.select(OmegaConf.load(PACKAGE_RECIPES / "callbacks" / f"{callback}.yaml"), callback)
    return textwrap.fill(
        ", ".join(settings_of(node)), 110, initial_indent=" " * 25, subsequent_indent=" " * 25
    )


def _callbacks() -> str:
    skip = {"robust", "none", "checkpoint"}
    return ", ".join(
        sorted(p.stem for p in (PACKAGE_RECIPES / "callbacks").glob("*.yaml") if p.stem not in skip)
    )


FIT = """usage: python -m robusttrain fit recipe=NAME [key=value ...]

Trains a recipe; the run's files (checkpoints, history.csv, efr.csv, ...) go to run_dir.

  recipe=NAME            {recipes}
  data.root=PATH         your own data: a folder with images/ and masks/ (default: the recipe's synthetic set)
  run_dir=PATH           where the run's files go (default: runs/<recipe>/<time>/)
  ckpt=last|PATH         resume: ckpt=last continues run_dir's checkpoints/last.ckpt
  overwrite=true         start over in a run_dir that holds an earlier run (removes robusttrain's files only)
  seed=N                 one seed for data, model and checks
  trainer.max_epochs=N   trainer.accelerator=cpu|gpu|auto  trainer.devices=N  trainer.precision=32-true|16-mixed
  data.image_size=N      data.batch_size=N  data.num_workers=N  data.val_fraction=F
  model=NAME             {models}  (model.<key>=... for its settings)
  logger=NAME            {loggers}
  callbacks.metamorphic.heldout=FAMILIES   test-only families (e.g. endoscopy_heldout), never trained on
  callbacks.metamorphic.suite.perturbations=[...]  callbacks.metamorphic.suite.severities=[2,4]
  callbacks.<name>.enabled=true|false      {callbacks}
  callbacks.metamorphic_training.KEY=...   metamorphic training's settings (robusttrain.training.settings):
{mt_keys}

Then: python -m robusttrain check recipe=NAME ckpt=RUN/ema.ckpt heldout=endoscopy_heldout  (the EMA, on in the recipes)
      python -m robusttrain report RUN
"""

CHECK = """usage: python -m robusttrain check recipe=NAME ckpt=PATH [key=value ...]

Scores a checkpoint on clean and perturbed images (the metamorphic suite: families x severities) and writes
its EFR tables with the per-case and per-follow-up scores.

  ckpt=PATH              the checkpoint (required), e.g. RUN/ema.ckpt, RUN/checkpoints/last.ckpt
  recipe=NAME            the recipe it was trained with: {recipes}
  data.root=PATH         a folder with images/ and masks/ to score (default: the recipe's validation split)
  split=all|val          with data.root: every case of the folder (all, the default) or its validation split
  heldout=FAMILIES       test-only families: a suite (endoscopy_heldout) or a list ([gamma,jpeg]); labelled
                         "held out" unless the run trained on them (then "trained", and one line says why);
                         adversarial attacks the checkpoint itself
  run_dir=PATH           where to write. A training run (it has config.yaml): into RUN/checks/<name>/, so
                         `report RUN` shows the training side and the check together; another folder: that
                         folder. Default: the checkpoint's training run, else runs/<recipe>/<time>/
  name=NAME              the folder under RUN/checks/ (default: <ckpt stem>-val or <ckpt stem>-<data folder>)
  callbacks.metamorphic.suite.perturbations=[...]  the families (default: the training run's suite)
  callbacks.metamorphic.suite.severities=[2,4]     callbacks.metamorphic.max_cases=N (a seeded subset)
  model=NAME, model.<key>=...  when the checkpoint was trained with other model settings than the recipe's

Cases whose mask is empty (no lesion) are kept out of the Dice means and the EFR and scored apart
(specificity: the share where the model predicts nothing; the false-positive area).
Writes: efr_table.csv/.md, check_cases.csv (per case), check_followups.csv (per follow-up: pair two
checkpoints on split, case_id, perturbation, severity, seed), check_empty_frames.csv, check.json,
config.check.yaml. Then: python -m robusttrain report RUN
"""

EVAL = """usage: python -m robusttrain {command} recipe=NAME ckpt=PATH [key=value ...]

  ckpt=PATH              the checkpoint (required; ckpt=last: run_dir's checkpoints/last.ckpt)
  recipe=NAME            {recipes}
  data.root=PATH         a folder with images/ and masks/ (default: the recipe's validation split)
  split=all|val          with data.root: every case (all, the default) or its validation split
  run_dir=PATH           a training run: writes config.{command}.yaml and logs/{command}/ beside it
"""

TOOLS = {
    "corners": "usage: python -m robusttrain corners RUN_DIR_OR_HISTORY_CSV [policy=last_inlier|maximin|pareto|cvar]"
    " [contamination=0.1] [worst_fraction=0.1] [tail=...] [metric=...]\n",
    "gallery": "usage: python -m robusttrain gallery [recipe=polyp] [out=gallery.png] [n=2] [tile=192] [colors=256]"
    " [data.root=PATH]\n",
    "report": "usage: python -m robusttrain report RUN_DIR [out=report.html]\n\nOne self-contained HTML page: the"
    " training side, the EFR tables and every check written into RUN_DIR/checks/.\n",
}


def command_help(command: str) -> str | None:
    """The help of one command, or None for an unknown command."""
    values = {
        "recipes": ", ".join(available_recipes()),
        "models": _group("model"),
        "loggers": _group("logger"),
        "callbacks": _callbacks(),
    }
    if command == "fit":
        values["mt_keys"] = _settings("metamorphic_training")
        return FIT.format(**values)
    if command == "check":
        return CHECK.format(**values)
    if command in ("validate", "test"):
        return EVAL.format(command=command, **values)
    return TOOLS.get(command)
