"""``--print_memory_plan``: each shipped GPU config's plan on a supposed H100, made on this CPU from
the models' config.json alone (no weights, no tokenizer), with each engine's profiling peak and its
KV cache in sequences; the Llama-3B engines of llama3b_qwen7b.yaml as shipped before are refused,
naming the fixes, and the shipped configs pass. One run goes as a user's does, in a process of its
own reading a hub cache that holds nothing but the config.json files; the others run in this
process, the hub ids read from tests/data/model_configs."""

import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # the recipes' CLI (a process of its own for one run)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "tests", "data", "model_configs")
MODELS = ["meta-llama/Llama-3.2-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-8B"]


def sequences(text):
    """Each engine's KV cache in sequences, as the plan prints it."""
    return {m[0]: float(m[1]) for m in re.findall(r"^engine (\w+): .* = (-?[\d.]+) sequences of", text, re.M)}


def test_the_llama_engines_as_shipped_before_are_refused_naming_the_fixes(tmp_path):
    hub = tmp_path / "hub"  # a hub cache that holds the three models' config.json and nothing else
    for model in MODELS:
        repo = hub / f"models--{model.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        snapshot = repo / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        shutil.copy(os.path.join(CONFIGS, model, "config.json"), snapshot / "config.json")
    shipped = open(os.path.join(ROOT, "configs", "llama3b_qwen7b.yaml")).read()
    assert "engine_settings: {gpu_memory_utilization: 0.15}" in shipped
    # before: 0.12 of the GPU, and vLLM's own batch of 1,024 sequences (drmas did not set one)
    before = tmp_path / "before.yaml"
    old = "engine_settings: {gpu_memory_utilization: 0.12, llm_args: {max_num_seqs: 1024}}"
    before.write_text(shipped.replace("engine_settings: {gpu_memory_utilization: 0.15}", old))
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "recipes", "search.py"), "fit", "--config",
                           str(before), "--print_memory_plan", "h100"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    assert sequences(text) == {"verifier": -0.4, "searcher": -0.4, "answerer": 6.5}
    assert re.search(r"^the vLLM engine of verifier cannot start: of its 0\.12 x 79\.2 GiB, .* give it "
                     r"fewer sequences per step \(engine_settings: \{llm_args: \{max_num_seqs: 474\}\} or "
                     r"fewer\), or a larger fraction \(engine_settings: \{gpu_memory_utilization: 0\.14\} or "
                     r"more\), or a shorter max_model_len$", text, re.M), text
    assert "sampler 2.20 for 1024 sequences" in text


def plan(monkeypatch, capsys, recipe, config, device="h100"):
    """The recipe's ``fit --print_memory_plan`` in this process: its exit code and what it printed."""
    import drmas.models
    from drmas.cli import run_recipe

    resolve = drmas.models.resolve_model_path
    monkeypatch.setattr(drmas.models, "resolve_model_path",
                        lambda name: os.path.join(CONFIGS, name) if name in MODELS else resolve(name))
    recipes = {"search": ("search.py", "search"), "math": ("math_team.py", "math_solver_verifier")}
    script, workflow = recipes[recipe]
    monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, "recipes", script)])
    with pytest.raises(SystemExit) as stop:
        run_recipe(workflow, recipe, os.path.join(ROOT, "configs", "smollm2_135m_cpu.yaml"),
                   args=["fit", "--config", os.path.join(ROOT, "configs", f"{config}.yaml"),
                         "--print_memory_plan", device])
    out = capsys.readouterr()
    return stop.value.code, out.out + out.err


def test_the_shipped_gpu_configs_fit_an_h100_with_their_kv_caches_printed(monkeypatch, capsys):
    runs = {("search", "llama3b_qwen7b"): {"verifier": 4.8, "searcher": 4.8, "answerer": 6.5},
            ("math", "llama3b_qwen7b"): {"solver": 6.4, "verifier": 4.7},
            ("search", "qwen3_8b"): {"shared": 5.4}, ("math", "qwen3_8b"): {"shared": 3.7},
            # per-policy pools: an engine alone on its GPU, taking half of it
            ("search", "llama3b_qwen7b_pools"): {"verifier": 36.2, "searcher": 36.2, "answerer": 51.5},
            ("math", "llama3b_qwen7b_pools"): {"solver": 51.2, "verifier": 36.2}}
    for (recipe, config), expected in runs.items():
        code, text = plan(monkeypatch, capsys, recipe, config)
        assert code == 0, text
        assert sequences(text) == expected, (recipe, config, text)
        assert "from the models' shapes" in text and "FSDP2's unsharded root" in text
        # the numbers the config file's comments quote are these
        comments = open(os.path.join(ROOT, "configs", f"{config}.yaml")).read()
        for engine, count in expected.items():
            assert f"{count:g} sequences" in comments, (config, engine)
    # a plan per pool: each device's policy sharded over its pool, its engine asked by the ranks
    # outside the pool too (search's Llama engines: 8 tasks x 5 x 4 ranks)
    code, text = plan(monkeypatch, capsys, "search", "llama3b_qwen7b_pools")
    assert "engine at once: verifier 160, searcher 160, answerer 80" in text
    pools = re.findall(r"^ranks ([\d-]+) \(policies (\w+)\):\nmemory plan per device \(each policy over its "
                       r"pool's ranks: \w+ (\d)", text, re.M)
    assert pools == [("0-1", "verifier", "2"), ("2-3", "searcher", "2"), ("4-7", "answerer", "4")], text
    assert re.search(r"^verifier +5\.98 +5\.98 +11\.97 ", text, re.M)  # 3.21B x 16 bytes / 2 ranks
    code, text = plan(monkeypatch, capsys, "search", "qwen3_8b", device="a100")
    assert code == 0 and "sampler 0.31 for 120 sequences" in text  # the rollout's width, not vLLM's 256
