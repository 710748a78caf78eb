"""``--print_memory_plan``: each shipped GPU config's plan on a supposed H100, made on this CPU from
the models' config.json alone (a hub cache holding nothing else: no weights, no tokenizer), with
each engine's profiling peak and its KV cache in sequences; the Llama-3B engines of
llama3b_qwen7b.yaml as shipped before are refused, naming the fixes, and the shipped configs pass."""

import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # recipe processes (about 9 s each)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "tests", "data", "model_configs")
MODELS = ["meta-llama/Llama-3.2-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-8B"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub cache that holds the three models' config.json and nothing else."""
    cache = tmp_path_factory.mktemp("hub")
    for model in MODELS:
        repo = cache / f"models--{model.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        snapshot = repo / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        shutil.copy(os.path.join(CONFIGS, model, "config.json"), snapshot / "config.json")
    return str(cache)


def plan(hub, recipe, config, device="h100"):
    env = {**os.environ, "HF_HUB_CACHE": hub, "HF_HUB_OFFLINE": "1"}
    script = os.path.join(ROOT, "recipes", f"{recipe}.py")
    out = subprocess.run([sys.executable, script, "fit", "--config", config, "--print_memory_plan", device],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    return out.returncode, out.stdout + out.stderr


def sequences(text):
    """Each engine's KV cache in sequences, as the plan prints it."""
    return {m[0]: float(m[1]) for m in re.findall(r"^engine (\w+): .* = (-?[\d.]+) sequences of", text, re.M)}


def test_the_llama_engines_as_shipped_before_are_refused_naming_the_fixes(hub, tmp_path):
    shipped = open(os.path.join(ROOT, "configs", "llama3b_qwen7b.yaml")).read()
    assert "engine_settings: {gpu_memory_utilization: 0.15}" in shipped
    # before: 0.12 of the GPU, and vLLM's own batch of 1,024 sequences (drmas did not set one)
    before = tmp_path / "before.yaml"
    old = "engine_settings: {gpu_memory_utilization: 0.12, llm_args: {max_num_seqs: 1024}}"
    before.write_text(shipped.replace("engine_settings: {gpu_memory_utilization: 0.15}", old))
    code, text = plan(hub, "search", str(before))
    assert code == 2, text
    assert sequences(text) == {"verifier": -0.4, "searcher": -0.4, "answerer": 6.5}
    assert re.search(r"^the vLLM engine of verifier cannot start: of its 0\.12 x 79\.2 GiB, .* give it "
                     r"fewer sequences per step \(engine_settings: \{llm_args: \{max_num_seqs: 474\}\} or "
                     r"fewer\), or a larger fraction \(engine_settings: \{gpu_memory_utilization: 0\.14\} or "
                     r"more\), or a shorter max_model_len$", text, re.M), text
    assert "sampler 2.20 for 1024 sequences" in text


def test_the_shipped_gpu_configs_fit_an_h100_with_their_kv_caches_printed(hub):
    runs = {("search", "llama3b_qwen7b"): {"verifier": 4.8, "searcher": 4.8, "answerer": 6.5},
            ("math_team", "llama3b_qwen7b"): {"solver": 6.4, "verifier": 4.7},
            ("search", "qwen3_8b"): {"shared": 5.4}, ("math_team", "qwen3_8b"): {"shared": 3.7}}
    for (recipe, config), expected in runs.items():
        code, text = plan(hub, recipe, os.path.join("configs", f"{config}.yaml"))
        assert code == 0, text
        assert sequences(text) == expected, (recipe, config, text)
        assert "from the models' shapes" in text and "FSDP2's unsharded root" in text
        # the numbers the config file's comments quote are these
        comments = open(os.path.join(ROOT, "configs", f"{config}.yaml")).read()
        for engine, count in expected.items():
            assert f"{count:g} sequences" in comments, (config, engine)
    code, text = plan(hub, "search", os.path.join("configs", "qwen3_8b.yaml"), device="a100")
    assert code == 0 and "sampler 0.31 for 120 sequences" in text  # the rollout's width, not vLLM's 256
