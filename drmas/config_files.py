"""Recipe config files: one file serves every recipe. Its top-level keys are common to all
recipes, and an optional ``recipes:`` mapping holds what differs per recipe (the workflow, group
size, response length), merged over the common part when that recipe reads the file::

    model: {policies: {shared: {model: Qwen/Qwen3-8B, optim: {lr: 1.0e-6}}}}
    recipes:
      search: {data: {rollout: {group_size: 5}}}
      math: {data: {rollout: {group_size: 8}}}

The merge happens as the file is read (a jsonargparse loader, :data:`PARSER_MODE`), so flags given
after ``--config`` still override it, and ``--print_config`` shows the merged result.

Workflows are named by their registered name (``--data.workflow search``; a user's workflow
registered with ``@WORKFLOWS.register("name")`` and imported before the CLI parses works the
same way), by class name, or by import path.
"""

from __future__ import annotations

from typing import Any

import yaml
from jsonargparse import get_loader, set_loader

from drmas.workflows.base import WORKFLOWS

__all__ = ["PARSER_MODE", "active_recipe", "merge_recipe_section", "resolve_argv_workflow",
           "resolve_workflow"]

PARSER_MODE = "drmas_yaml"
_ROOT_KEYS = {"trainer", "model", "data", "checkpoint", "hf_checkpoint", "seed_everything", "ckpt_path",
              "collective_timeout_s", "gather_timeout_s", "print_memory_plan",
              "recipes"}
active_recipe: list[str] = []  # the recipe whose section a config file contributes (DrmasCLI sets it)


def _deep_merge(base: Any, over: Any) -> Any:
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    if "class_path" in over and over["class_path"] != base.get("class_path"):
        return over  # another class: the common init_args do not apply to it
    out = dict(base)
    for key, value in over.items():
        out[key] = _deep_merge(base[key], value) if key in base else value
    return out


def merge_recipe_section(config: dict[str, Any], recipe: str | None) -> dict[str, Any]:
    """The common part of ``config`` with ``config["recipes"][recipe]`` merged over it (nested
    mappings merge key by key, anything else is replaced)."""
    sections = config.get("recipes") or {}
    if not isinstance(sections, dict) or not all(isinstance(v, dict) for v in sections.values()):
        raise ValueError("config key 'recipes' must map recipe names to config sections, "
                         f"got {sections!r}")
    common = {k: v for k, v in config.items() if k != "recipes"}
    if recipe is None or recipe not in sections:
        return common
    unknown = set(sections[recipe]) - (_ROOT_KEYS - {"recipes"})
    if unknown:
        raise ValueError(f"config key 'recipes.{recipe}' has unknown keys {sorted(unknown)}; "
                         f"allowed: {sorted(_ROOT_KEYS - {'recipes'})}")
    return _deep_merge(common, sections[recipe])


def resolve_workflow(name: Any) -> Any:
    """The import path of a workflow registered as ``name``; anything else unchanged."""
    if isinstance(name, str) and name in WORKFLOWS:
        cls = WORKFLOWS.get(name)
        return f"{cls.__module__}.{cls.__qualname__}"
    return name


def _resolve_config_workflow(config: dict[str, Any]) -> None:
    data = config.get("data")
    if isinstance(data, dict) and "workflow" in data:
        wf = data["workflow"]
        if isinstance(wf, dict) and "class_path" in wf:
            data["workflow"] = {**wf, "class_path": resolve_workflow(wf["class_path"])}
        else:
            data["workflow"] = resolve_workflow(wf)


def resolve_argv_workflow(args: list[str]) -> list[str]:
    """``--data.workflow NAME`` (or ``.class_path``, or with ``=``) with registered names resolved."""
    flags = ("--data.workflow", "--data.workflow.class_path")
    out = list(args)
    for i, arg in enumerate(out):
        if arg in flags and i + 1 < len(out):
            out[i + 1] = resolve_workflow(out[i + 1])
        elif "=" in arg and arg.split("=", 1)[0] in flags:
            flag, value = arg.split("=", 1)
            out[i] = f"{flag}={resolve_workflow(value)}"
    return out


def _load(text: str) -> Any:
    value = _yaml_load(text)
    # Only a whole config file has a top-level ``recipes`` key; values of single flags pass through.
    if isinstance(value, dict) and set(value) <= _ROOT_KEYS:
        # names resolved in every section first, so a section's class_path compares like with like
        for section in [value, *(v for v in (value.get("recipes") or {}).values() if isinstance(v, dict))]:
            _resolve_config_workflow(section)
        if "recipes" in value:
            value = merge_recipe_section(value, active_recipe[-1] if active_recipe else None)
    return value


_yaml_load = get_loader("yaml")  # jsonargparse's own YAML reading, before ours is registered
set_loader(PARSER_MODE, _load, exceptions=(yaml.YAMLError, ValueError))
