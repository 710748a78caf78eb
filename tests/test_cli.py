"""Per-recipe config sections (one file, merged differently by each recipe), and workflows by name."""

import re
import sys
from pathlib import Path

import pytest
import yaml
from forked import run_script

from drmas.config_files import merge_recipe_section, resolve_argv_workflow, resolve_workflow

ROOT = Path(__file__).resolve().parents[1]

CONFIG = {
    "model": {"policies": {"shared": {"model": "m", "optim": {"lr": 1e-6},
                                      "generation": {"train": {"temperature": 1.0}}}}},
    "data": {"rollout": {"group_size": 4}, "workflow": {"class_path": "A", "init_args": {"x": 1, "y": 2}}},
    "recipes": {
        "one": {"model": {"policies": {"shared": {"generation": {"train": {"max_new_tokens": 9}}}}},
                "data": {"workflow": {"init_args": {"y": 3}}}},
        "two": {"data": {"rollout": {"group_size": 8},
                         "workflow": {"class_path": "B", "init_args": {"z": 0}}}},
    },
}


def test_sections_merge_key_by_key_over_the_common_part():
    one = merge_recipe_section(CONFIG, "one")
    assert one["model"]["policies"]["shared"] == {
        "model": "m", "optim": {"lr": 1e-6},
        "generation": {"train": {"temperature": 1.0, "max_new_tokens": 9}}}
    assert one["data"] == {"rollout": {"group_size": 4},
                           "workflow": {"class_path": "A", "init_args": {"x": 1, "y": 3}}}
    assert "recipes" not in one


def test_another_class_replaces_the_common_init_args():
    assert merge_recipe_section(CONFIG, "two")["data"] == {
        "rollout": {"group_size": 8}, "workflow": {"class_path": "B", "init_args": {"z": 0}}}


def test_a_recipe_without_a_section_gets_the_common_part():
    assert merge_recipe_section(CONFIG, "three") == {k: v for k, v in CONFIG.items() if k != "recipes"}
    assert merge_recipe_section(CONFIG, None)["data"]["rollout"]["group_size"] == 4


def test_malformed_sections_are_named():
    with pytest.raises(ValueError, match="'recipes' must map recipe names"):
        merge_recipe_section({"recipes": ["one"]}, "one")
    with pytest.raises(ValueError, match=r"'recipes.one' has unknown keys \['dataa'\]"):
        merge_recipe_section({"recipes": {"one": {"dataa": {}}}}, "one")


# ---- workflows by registered name -----------------------------------------------------------

USER_RECIPE = '''
import sys
from dataclasses import dataclass

from drmas.cli import run_recipe
from drmas.engines import ENGINES, HFEngine
from drmas.workflows.base import WORKFLOWS
from drmas.workflows.math import SolverVerifierWorkflow


@dataclass
class CountingSettings:
    label: str = "counting"
    """What the engine calls itself in its closing line."""
    context: int = 1024
    """The context length it declares."""


@ENGINES.register("counting")
class CountingEngine(HFEngine):
    """A user's own engine, registered by name with settings of its own: HF generate, counting
    the prompts it serves."""

    settings_type = CountingSettings  # by name only: auto_preference is not inherited from HFEngine
    served = 0

    @classmethod
    def create(cls, policy, settings, place, pool, team):
        engine, fresh = super().create(policy, settings, place, pool, team)
        engine.label, engine.context_length = settings.label, settings.context
        return engine, fresh

    @classmethod
    def context_limit(cls, settings):
        return settings.context

    def generate(self, prompts, n, params, stops=None, max_new_tokens=None):
        type(self).served += len(prompts)
        return super().generate(prompts, n, params, stops, max_new_tokens)

    def close(self):
        print(f"{self.label} engine served {type(self).served} prompts within {self.context_length}",
              flush=True)


@WORKFLOWS.register("toy_math")
class ToyMath(SolverVerifierWorkflow):
    """A user's own workflow, registered by name."""

    def __init__(self, loops: int = 3) -> None:
        super().__init__(max_turns=loops)


if __name__ == "__main__":
    run_recipe("toy_math", "toy")
'''


def test_registered_names_resolve_to_import_paths():
    assert resolve_workflow("search") == "drmas.workflows.search.workflow.SearchWorkflow"
    assert (resolve_workflow("math_reasoner_tool_user")
            == "drmas.workflows.math.reasoner_tool_user.ReasonerToolUserWorkflow")
    assert resolve_workflow("SearchWorkflow") == "SearchWorkflow"  # class names are jsonargparse's to resolve
    assert resolve_argv_workflow(["--data.workflow", "search",
                                   "--data.workflow.class_path=math_solver_verifier",
                                   "--model.engine", "search"]) == [
        "--data.workflow", "drmas.workflows.search.workflow.SearchWorkflow",
        "--data.workflow.class_path=drmas.workflows.math.solver_verifier.SolverVerifierWorkflow",
        "--model.engine", "search"]


def run_user_recipe(tmp_path, *args):
    script = tmp_path / "my_recipe.py"
    script.write_text(USER_RECIPE)
    argv = [str(script), "fit", "--config", str(ROOT / "configs/tiny_random.yaml"),
            "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"), *args]
    return run_script(argv, cwd=tmp_path, timeout=600)


@pytest.mark.integration
def test_a_users_registered_workflow_works_by_name(tmp_path):
    proc = run_user_recipe(tmp_path, "--data.workflow", "toy_math", "--data.workflow.init_args.loops", "5",
                           "--print_config")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "args parameter" not in proc.stderr  # no LightningCLI warning about argv
    printed = yaml.safe_load(proc.stdout)
    assert printed["data"]["workflow"] == {"class_path": "__main__.ToyMath", "init_args": {"loops": 5}}

    # by name in a config file too, and it trains: one iteration on the tiny model, with the
    # user's engine, registered by name too, configured from YAML with its own settings (the
    # tiny config's vLLM settings stay vLLM's; a policy's own override the module's)
    (tmp_path / "toy.yaml").write_text(
        "data:\n  workflow: {class_path: toy_math, init_args: {loops: 1}}\n  validation: {tasks: 0}\n"
        "trainer: {max_epochs: 1}\n"
        "model:\n  engine: counting\n  engine_settings: {label: tally, context: 512}\n"
        "  policies: {shared: {engine_settings: {context: 768}}}\n")
    proc = run_user_recipe(tmp_path, "--config", str(tmp_path / "toy.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one loop: no check
    assert "solver" in proc.stdout and "verifier" not in proc.stdout.split("agent", 1)[1]
    served = re.search(r"tally engine served (\d+) prompts within 768", proc.stdout)
    assert served and int(served.group(1)) > 0, proc.stdout[-2000:]
    proc = run_user_recipe(tmp_path, "--config", str(tmp_path / "toy.yaml"), "--model.engine", "sglang")
    assert (proc.returncode != 0
            and "engine must be 'auto' or one of ['counting', 'hf', 'vllm'], got 'sglang'" in proc.stderr)
    proc = run_user_recipe(tmp_path, "--config", str(tmp_path / "toy.yaml"),
                           "--model.engine_settings.labl", "x")
    assert proc.returncode != 0 and ("unknown setting 'labl' of engine 'counting' in "
                                     "--model.engine_settings; known: ['label', 'context']") in proc.stderr


@pytest.mark.parametrize("config", ["hetero_cpu.yaml", "llama3b_qwen7b.yaml", "llama3b_qwen7b_pools.yaml"])
@pytest.mark.parametrize("recipe", ["search", "math"])
def test_the_team_configs_give_each_agent_its_own_model(config, recipe, capsys, monkeypatch):
    from drmas.cli import DrmasCLI

    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # the args below are the whole command line
    workflow = {"search": "search", "math": "math_solver_verifier"}[recipe]
    with pytest.raises(SystemExit) as done:
        DrmasCLI(workflow, recipe, None,
                 args=["fit", "--config", str(ROOT / "configs" / config), "--print_config"])
    assert done.value.code in (0, None)
    policies = yaml.safe_load(capsys.readouterr().out)["model"]["policies"]
    agents = {"search": {"verifier", "searcher", "answerer"}, "math": {"solver", "verifier"}}[recipe]
    assert set(policies) == agents  # one policy per agent, nothing left of the default "shared"
    families = {p["model"].split("/")[0].split(":")[0] for p in policies.values()}
    assert len(families) == 2, families
    if config == "hetero_cpu.yaml":  # the SmolLM2 agents: LoRA adapters on one shared base
        lora = [name for name, p in policies.items() if p["lora"]]
        assert lora and all(policies[name]["lora"]["share_base"] and policies[name]["lora"]["rank"] == 16
                            for name in lora)
    elif config == "llama3b_qwen7b.yaml":  # the engines' GPU fractions fit one GPU
        assert sum(p["engine_settings"]["gpu_memory_utilization"] for p in policies.values()) <= 1
    else:  # each policy on GPUs of its own: 8 in all, contiguous after the policies before it
        assert [p["ranks"] for p in policies.values()] == {"search": [2, 2, 4], "math": [4, 4]}[recipe]
