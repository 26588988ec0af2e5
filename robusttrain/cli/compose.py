"""Find and compose recipes with Hydra; turn Hydra's errors into one clear line.

A ``recipes/`` folder in the working directory is searched before the packaged recipes,
so a user recipe can reuse the packaged groups (data/, model/, trainer/, callbacks/, logger/).
A local file that shadows a packaged one (``./recipes/polyp.yaml``) is announced on stderr every
time: its ``_target_`` s run, so the user must know it is not the packaged recipe. A YAML error in
any recipe file (``!!python/...`` tags included) is one line naming the file and line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf

from robusttrain.cli.errors import UsageError
from robusttrain.cli.settings_keys import settings_of

PACKAGE_RECIPES = Path(__file__).resolve().parent.parent / "recipes"
GROUPS = ("data", "model", "trainer", "callbacks", "logger")


def user_recipes_dir() -> Path | None:
    d = Path.cwd() / "recipes"
    return d if d.is_dir() else None


def available_recipes() -> list[str]:
    """Recipe names: top-level ``*.yaml`` of ./recipes (first) and of the package."""
    names: set[str] = set()
    for d in filter(None, (user_recipes_dir(), PACKAGE_RECIPES)):
        names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def _compose_raw(recipe: str, overrides: list[str]) -> DictConfig:
    user = user_recipes_dir()
    primary = user if user is not None else PACKAGE_RECIPES
    extra = [f"hydra.searchpath=[file://{PACKAGE_RECIPES}]"] if user is not None else []
    with initialize_config_dir(config_dir=str(primary), version_base=None):
        return compose(config_name=recipe, overrides=extra + overrides)


def shadowed() -> list[str]:
    """Files of ./recipes that replace a packaged recipe file of the same relative path."""
    user = user_recipes_dir()
    if user is None:
        return []
    return sorted(
        str(p.relative_to(user))
        for p in user.rglob("*.yaml")
        if (PACKAGE_RECIPES / p.relative_to(user)).is_file()
    )


def _yaml_error(e: BaseException) -> str | None:
    """One line for a YAML error anywhere in ``e``'s chain (Hydra wraps some), else None."""
    import yaml

    seen: BaseException | None = e
    while seen is not None and not isinstance(seen, yaml.YAMLError):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return None
    mark = getattr(seen, "problem_mark", None) or getattr(seen, "context_mark", None)
    where = f"'{mark.name}:{mark.line + 1}'" if mark is not None else "a recipe file"
    problem = str(getattr(seen, "problem", None) or str(seen).strip().splitlines()[0])
    if "python/" in problem:
        problem += " (Python tags are not allowed: recipes are plain YAML)"
    return f"cannot read {where}: {problem}"


def compose_recipe(recipe: str | None, overrides: list[str]) -> DictConfig:
    """Compose ``recipes/<recipe>.yaml`` with ``key=value`` overrides; raise UsageError on bad input.

    >>> cfg = compose_recipe("smoke", ["trainer.max_epochs=1"])
    >>> cfg.trainer.max_epochs, cfg.recipe
    (1, 'smoke')
    """
    for name in shadowed():
        print(
            f"[robusttrain] ./recipes/{name} replaces the packaged recipe file {name} (its _target_s run "
            "as written there)",
            file=sys.stderr,
            flush=True,
        )
    try:
        return _compose_checked(recipe, overrides)
    except UsageError:
        raise
    except Exception as e:
        line = _yaml_error(e)
        if line is None:
            raise
        raise UsageError(line) from None


def _compose_checked(recipe: str | None, overrides: list[str]) -> DictConfig:
    choices = available_recipes()
    if not recipe:
        raise UsageError(f"missing recipe=NAME; available recipes: {', '.join(choices)}")
    if recipe not in choices:
        raise UsageError(f"unknown recipe '{recipe}'; available recipes: {', '.join(choices)}")
    for o in overrides:
        if "=" not in o:
            raise UsageError(f"expected key=value, got '{o}'")
    _check_group_choices(overrides)
    overrides = _allow_new_keys_in_open_mappings(recipe, overrides)
    try:
        cfg = _compose_raw(recipe, overrides)
    except MissingConfigException as e:
        raise UsageError(_missing_group_message(str(e))) from None
    except ConfigCompositionException as e:
        if _yaml_error(e):
            raise
        m = re.search(r"Could not override '([^']+)'", str(e))
        if m:
            raise UsageError(_unknown_key_message(recipe, m.group(1))) from None
        raise UsageError(_first_line(e)) from None
    except OverrideParseException as e:
        raise UsageError(f"cannot parse override: {_first_line(e)}") from None
    _check_value_types(recipe, cfg, overrides)
    return cfg


def group_options(group: str) -> list[str]:
    """Config names of a group folder (``data`` -> ``acdc, cxr, polyp``) in ./recipes and the package."""
    names: set[str] = set()
    for d in filter(None, (user_recipes_dir(), PACKAGE_RECIPES)):
        if (d / group).is_dir():
            names.update(p.stem for p in (d / group).glob("*.yaml"))
    return sorted(names)


def _is_group(key: str) -> bool:
    return any((d / key).is_dir() for d in filter(None, (user_recipes_dir(), PACKAGE_RECIPES)))


def _check_group_choices(overrides: list[str]) -> None:
    """A group choice must name a config of that group: ``data=../../x`` would make Hydra load a
    YAML from outside the recipe folders. Hydra's own settings (``hydra.*``, e.g. the search path)
    are the CLI's, not the command line's."""
    for o in overrides:
        key, value = o.split("=", 1)
        name = key.lstrip("+~").split("@")[0]
        if name == "hydra" or name.startswith(("hydra.", "hydra/")):
            raise UsageError(
                f"'{key}' cannot be set on the command line (robusttrain composes the recipe "
                "itself; put extra recipes in ./recipes)"
            )
        if "/" in name or _is_group(name):
            group = name if re.fullmatch(r"\w+(/\w+)*", name) and _is_group(name) else None
            valid = group_options(group) if group else []
            if group is None or value not in valid:
                what = f"{group} '{value}'" if group else f"config group '{name}'"
                raise UsageError(
                    f"unknown {what}; valid choices: {', '.join(valid)}"
                    if group
                    else f"unknown {what}; valid groups: {', '.join(GROUPS)}"
                )


def _allow_new_keys_in_open_mappings(recipe: str, overrides: list[str]) -> list[str]:
    """``data.extra_val.etis=PATH`` adds a key: name -> value mappings that are empty in the recipe
    (e.g. ``data.extra_val: {}``) are open, so such keys get Hydra's ``+`` instead of an error. So does
    a setting of the node's class that the recipe leaves out (:mod:`robusttrain.cli.settings_keys`)."""
    candidates = [o for o in overrides if not o.startswith(("+", "~")) and "." in o.split("=", 1)[0]]
    if not candidates:
        return overrides
    try:
        base = _compose_raw(recipe, [o for o in overrides if o.split("=", 1)[0] in GROUPS])
    except Exception:  # the real composition below reports the problem
        return overrides
    out = []
    for o in overrides:
        key = o.split("=", 1)[0]
        parent = key.rpartition(".")[0]
        node = OmegaConf.select(base, parent, default=None) if o in candidates else None
        leaf = key.rpartition(".")[2]
        if (
            isinstance(node, DictConfig)
            and leaf not in node
            and (len(node) == 0 or leaf in settings_of(node))
        ):
            o = "+" + o
        out.append(o)
    return out


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _missing_group_message(text: str) -> str:
    m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    opts = re.findall(r"^\t(\S+)$", text, flags=re.M)
    if m:
        return f"unknown {m.group(1)} '{m.group(2)}'; valid choices: {', '.join(opts)}"
    return text.strip().splitlines()[0]


def _unknown_key_message(recipe: str, key: str) -> str:
    base = _compose_raw(recipe, [])
    parent = key.rpartition(".")[0]
    while parent and not isinstance(OmegaConf.select(base, parent, default=None), DictConfig):
        parent = parent.rpartition(".")[0]  # report the deepest group that does exist
    node = OmegaConf.select(base, parent) if parent else base
    valid = ", ".join([str(k) for k in node] + [k for k in settings_of(node) if k not in node])
    where = f"under '{parent}'" if parent else "at the top level"
    return (
        f"unknown key '{key}'; valid keys {where}: {valid} "
        f"(to add a key the recipe does not have, write +{key}=...)"
    )


def _check_value_types(recipe: str, cfg: DictConfig, overrides: list[str]) -> None:
    """Reject an override whose value does not match the type of the recipe's default.

    Hydra accepts ``trainer.max_epochs=abc`` happily; the failure would surface much later,
    deep inside Lightning. Checking against the default's type catches it here.
    """
    base = _compose_raw(recipe, [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in GROUPS])
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in GROUPS or key.startswith("hydra"):
            continue
        default = OmegaConf.select(base, key, default=None, throw_on_missing=False)
        if default is None:  # a setting the recipe leaves out: its class's default
            parent, _, leaf = key.rpartition(".")
            default = settings_of(OmegaConf.select(base, parent, default=None)).get(leaf) if parent else None
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        if default is None or value is None:
            continue
        expected = _kind(default)
        if expected and not _compatible(expected, value):
            raise UsageError(
                f"bad value for '{key}': {value!r} (expected {expected}, "
                f"recipe default {OmegaConf.to_container(default) if isinstance(default, (DictConfig, ListConfig)) else default!r})"
            )


def _kind(v: Any) -> str | None:
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, (ListConfig, list)):
        return "a list"
    if isinstance(v, (DictConfig, dict)):
        return "a mapping"
    return None  # strings accept anything


def _compatible(expected: str, v: Any) -> bool:
    if expected == "true/false":
        return isinstance(v, bool)
    if expected == "an integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if expected == "a number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if expected == "a list":
        return isinstance(v, (ListConfig, list))
    if expected == "a mapping":
        return isinstance(v, (DictConfig, dict))
    return True
