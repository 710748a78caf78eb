"""The documented entry points: the README's commands and the example they run."""

import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch

from drmas.models import load_causal_lm

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    return re.findall(r"```bash\n#[^\n]*\n([^\n]+)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readmes_second_command():
    commands = _readme_commands()
    assert len(commands) >= 2
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [commands[1]]


@pytest.mark.integration  # loads a model, samples and runs four backward passes (~4 s)
def test_the_example_centres_each_agent_where_a_shared_baseline_offsets_one():
    # the example's rollout and comparison on tiny-random, with rewards set by hand (the random
    # model earns none): judge 1, 0, 1, 0 and picker 10, 0, 6, 4, one task
    path = ROOT / "examples" / "agentwise_gradients.py"
    spec = importlib.util.spec_from_file_location("agentwise_gradients", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model, tok = load_causal_lm("tiny-random")
    torch.manual_seed(0)
    rollouts, samples = example.rollout(model, tok, group=4, max_new_tokens=4)
    for s, r in zip(samples, [1, 0, 1, 0, 10, 0, 6, 4]):
        s.reward = float(r)
    rows = {(est, agent): rest for est, agent, *rest in example.compare(model, rollouts, samples)}
    # grpo_step pools both agents: mean 2.75, unbiased std sqrt(93.5 / 7); the judge's four
    # advantages all sit below zero, by -2.25 / 3.6547 on average, and the picker's above
    pooled = math.sqrt(93.5 / 7)
    assert rows["grpo_step", "judge"][2] == pytest.approx(-2.25 / pooled, abs=1e-5)
    assert rows["grpo_step", "picker"][2] == pytest.approx(2.25 / pooled, abs=1e-5)
    # drmas: each agent's own mean and std, zero mean and unit std for both
    for agent in ("judge", "picker"):
        _, _, adv_mean, adv_std, grad = rows["drmas", agent]
        assert adv_mean == pytest.approx(0.0, abs=1e-6) and adv_std == pytest.approx(1.0, abs=1e-5)
        assert grad > 0 and rows["grpo_step", agent][4] > 0
