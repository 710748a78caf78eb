"""Regression values that see the RL maths: each recipe's first two iterations on tiny-random
with the rigged engine (``tests/recipes/rigged.py``: scripted well-formed and malformed replies,
scored by the policy itself), the HF engine's fp32 model and ``--trainer.precision 32-true``.
Rewards differ within every group, so the advantages are not zero, and the pinned loss, gradient
norm and clip fractions carry the estimator's normalisation, the clip, the old log-probs and the
importance weights. One more run is off-policy: two PPO epochs at a larger learning rate (the
second epoch's ratios move off 1 on both sides and are clipped) and a behaviour policy that
drifts from the trained one along each reply (``DRMAS_RIG_DRIFT``), so the importance cap
truncates the weights of late tokens.

A numeric change (a loss scale, a mask, a reward rule, an estimator) fails here and is updated on
purpose: ``python tests/recipes/test_regression.py`` prints the values of this machine to paste,
and the commit says why.

Measured on an AMD EPYC with AVX-512 BF16 (fp32 throughout, so the CPU kind changes only the
order of sums). Tolerances: rewards and advantages to 1e-5 (they follow from the scripted replies
alone); the loss and the gradient norm to 1e-2 relative; the clip and truncated fractions to 0.01
absolute (about three tokens: a token at a bound may fall either side on another CPU). Doubled
advantages, a wider clip or another importance cap each move a pinned value far more."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ for forked

import pytest  # noqa: E402
from recipe_runs import RIGGED_RUNS, rigged_run, run_dir, scalars  # noqa: E402

pytestmark = pytest.mark.integration  # one recipe run each, in a process of its own


def pinned(tag: str) -> bool:
    return tag.endswith(("/reward_mean", "/advantage_abs_mean", "/loss", "/grad_norm", "/clip_frac_low",
                         "/clip_frac_high", "/importance_weight_mean", "/importance_truncated_frac"))


def pinned_values(tmp: Path) -> dict[str, dict[int, float]]:
    s = scalars(run_dir(tmp))
    return {tag: v for tag, v in sorted(s.items()) if not tag.startswith("_") and pinned(tag)}


def formatted(values: dict[str, dict[str, dict[int, float]]]) -> str:
    lines = ["EXPECTED: dict[str, dict[str, dict[int, float]]] = {"]
    for run, tags in sorted(values.items()):
        lines.append(f'    "{run}": {{')
        lines += [f'        "{tag}": {{{", ".join(f"{i}: {v!r}" for i, v in sorted(v.items()))}}},'
                  for tag, v in sorted(tags.items())]
        lines.append("    },")
    return "\n".join([*lines, "}"])


def tolerance(tag: str) -> dict:
    if tag.endswith(("/reward_mean", "/advantage_abs_mean")):
        return {"abs": 1e-5}
    if tag.endswith(("/clip_frac_low", "/clip_frac_high", "/importance_truncated_frac")):
        return {"abs": 0.01}
    return {"rel": 1e-2}


EXPECTED: dict[str, dict[str, dict[int, float]]] = {
    "agents": {
        "rollout/solver/advantage_abs_mean": {1: 0.744711, 2: 0.807998},
        "rollout/solver/reward_mean": {1: -0.04, 2: -0.0625},
        "rollout/verifier/advantage_abs_mean": {1: 0.353548, 2: 0.0},
        "rollout/verifier/reward_mean": {1: -0.025, 2: -0.1},
        "train/shared/clip_frac_high": {1: 0.0, 2: 0.0},
        "train/shared/clip_frac_low": {1: 0.0, 2: 0.0},
        "train/shared/grad_norm": {1: 2.463473, 2: 1.256204},
        "train/shared/importance_truncated_frac": {1: 0.0, 2: 0.0},
        "train/shared/importance_weight_mean": {1: 1.0, 2: 1.0},
        "train/shared/loss": {1: 0.452611, 2: 0.257169},
        "val/solver/reward_mean": {0: -0.066667, 2: -0.033333},
        "val/verifier/reward_mean": {0: -0.05, 2: -0.05},
    },
    "code": {
        "rollout/coder/advantage_abs_mean": {1: 0.0, 2: 0.306186},
        "rollout/coder/reward_mean": {1: 0.0, 2: 0.5},
        "rollout/tester/advantage_abs_mean": {1: 0.807998, 2: 0.866024},
        "rollout/tester/reward_mean": {1: -0.0625, 2: 0.7},
        "train/shared/clip_frac_high": {1: 0.0, 2: 0.0},
        "train/shared/clip_frac_low": {1: 0.0, 2: 0.0},
        "train/shared/grad_norm": {1: 0.899945, 2: 1.363874},
        "train/shared/importance_truncated_frac": {1: 0.0, 2: 0.0},
        "train/shared/importance_weight_mean": {1: 1.0, 2: 1.0},
        "train/shared/loss": {1: -0.186282, 2: -0.372513},
        "val/coder/reward_mean": {0: 0.0, 2: 0.0},
        "val/tester/reward_mean": {0: -0.1, 2: -0.1},
    },
    "debate": {
        "rollout/debater_a/advantage_abs_mean": {1: 0.707101, 2: 0.707101},
        "rollout/debater_a/reward_mean": {1: 0.2, 2: 0.7},
        "rollout/debater_b/advantage_abs_mean": {1: 0.707101, 2: 0.707101},
        "rollout/debater_b/reward_mean": {1: -0.325, 2: -0.775},
        "rollout/judge/advantage_abs_mean": {1: 0.353548, 2: 0.353548},
        "rollout/judge/reward_mean": {1: -0.075, 2: -0.025},
        "train/shared/clip_frac_high": {1: 0.0, 2: 0.0},
        "train/shared/clip_frac_low": {1: 0.0, 2: 0.0},
        "train/shared/grad_norm": {1: 1.434858, 2: 0.576142},
        "train/shared/importance_truncated_frac": {1: 0.0, 2: 0.0},
        "train/shared/importance_weight_mean": {1: 1.0, 2: 1.0},
        "train/shared/loss": {1: 0.26427, 2: 0.11732},
        "val/debater_a/reward_mean": {0: 0.45, 2: 0.45},
        "val/debater_b/reward_mean": {0: -0.525, 2: -0.575},
        "val/judge/reward_mean": {0: -0.05, 2: -0.05},
    },
    "games": {  # the worked example changed (a plan no board can take): new prompts, new values
        "rollout/planner/advantage_abs_mean": {1: 0.866022, 2: 0.374999},
        "rollout/planner/reward_mean": {1: 0.175, 2: -0.170833},
        "rollout/tool_user/advantage_abs_mean": {1: 0.866024, 2: 0.796197},
        "rollout/tool_user/reward_mean": {1: -0.25, 2: -0.541667},
        "train/shared/clip_frac_high": {1: 0.0, 2: 0.0},
        "train/shared/clip_frac_low": {1: 0.0, 2: 0.0},
        "train/shared/grad_norm": {1: 1.641364, 2: 0.863667},
        "train/shared/importance_truncated_frac": {1: 0.0, 2: 0.0},
        "train/shared/importance_weight_mean": {1: 1.0, 2: 1.0},
        "train/shared/loss": {1: -0.179741, 2: -0.090303},
        "val/planner/reward_mean": {0: -0.233333, 2: -0.275},
        "val/tool_user/reward_mean": {0: -0.608333, 2: -0.633333},
    },
    "math": {
        "rollout/solver/advantage_abs_mean": {1: 0.707097, 2: 0.744711},
        "rollout/solver/reward_mean": {1: -0.05, 2: -0.06},
        "rollout/verifier/advantage_abs_mean": {1: 0.0, 2: 0.353548},
        "rollout/verifier/reward_mean": {1: 0.0, 2: -0.025},
        "train/shared/clip_frac_high": {1: 0.0, 2: 0.0},
        "train/shared/clip_frac_low": {1: 0.0, 2: 0.0},
        "train/shared/grad_norm": {1: 1.909686, 2: 1.722385},
        "train/shared/importance_truncated_frac": {1: 0.0, 2: 0.0},
        "train/shared/importance_weight_mean": {1: 1.0, 2: 1.0},
        "train/shared/loss": {1: 0.348834, 2: 0.342382},
        "val/solver/reward_mean": {0: -0.06, 2: -0.042857},
        "val/verifier/reward_mean": {0: -0.025, 2: -0.075},
    },
    "math-off-policy": {
        "rollout/solver/advantage_abs_mean": {1: 0.707097, 2: 0.744711},
        "rollout/solver/reward_mean": {1: -0.05, 2: -0.06},
        "rollout/verifier/advantage_abs_mean": {1: 0.0, 2: 0.353548},
        "rollout/verifier/reward_mean": {1: 0.0, 2: -0.025},
        "train/shared/clip_frac_high": {1: 0.046667, 2: 0.033333},
        "train/shared/clip_frac_low": {1: 0.31, 2: 0.361538},
        "train/shared/grad_norm": {1: 0.354777, 2: 0.420525},
        "train/shared/importance_truncated_frac": {1: 0.453333, 2: 0.523077},
        "train/shared/importance_weight_mean": {1: 1.616789, 2: 1.673014},
        "train/shared/loss": {1: 0.599586, 2: 0.591051},
        "val/solver/reward_mean": {0: -0.06, 2: -0.042857},
        "val/verifier/reward_mean": {0: -0.025, 2: -0.075},
    },
    "search": {
        "rollout/answerer/advantage_abs_mean": {1: 0.353548, 2: 0.0},
        "rollout/answerer/reward_mean": {1: -0.025, 2: -0.05},
        "rollout/searcher/advantage_abs_mean": {1: 0.707097, 2: 0.707097},
        "rollout/searcher/reward_mean": {1: -0.05, 2: -0.05},
        "rollout/verifier/advantage_abs_mean": {1: 0.807998, 2: 0.749985},
        "rollout/verifier/reward_mean": {1: 0.9625, 2: 0.95},
        "train/shared/clip_frac_high": {1: 0.0, 2: 0.0},
        "train/shared/clip_frac_low": {1: 0.0, 2: 0.0},
        "train/shared/grad_norm": {1: 1.020456, 2: 0.790232},
        "train/shared/importance_truncated_frac": {1: 0.0, 2: 0.0},
        "train/shared/importance_weight_mean": {1: 1.0, 2: 1.0},
        "train/shared/loss": {1: -0.114048, 2: -0.09428},
        "val/answerer/reward_mean": {0: -0.0375, 2: -0.0625},
        "val/searcher/reward_mean": {0: -0.05, 2: -0.05},
        "val/verifier/reward_mean": {0: 0.94375, 2: 0.95625},
    },
}


@pytest.mark.parametrize("run", sorted(RIGGED_RUNS))
def test_the_first_two_iterations_of_each_recipe_have_their_recorded_values(rigged, run):
    got = pinned_values(rigged(run)[0])
    want = EXPECTED[run]
    assert set(got) == set(want)
    for tag, values in want.items():
        assert got[tag] == {i: pytest.approx(v, **tolerance(tag)) for i, v in values.items()}, tag


def test_every_run_has_advantages_and_the_off_policy_run_clips_and_truncates():
    # what makes the values above worth pinning, read from them: every agent of every recipe has
    # a non-zero advantage in some iteration, and the off-policy run's clip and cap both act
    for run, values in EXPECTED.items():
        advantages = {tag: v for tag, v in values.items() if tag.endswith("/advantage_abs_mean")}
        assert advantages and all(max(v.values()) > 0.1 for v in advantages.values()), run
    off = EXPECTED["math-off-policy"]
    for side in ("low", "high"):  # each side of the clip bounds some ratios in both iterations
        assert min(off[f"train/shared/clip_frac_{side}"].values()) > 0.02
    assert min(off["train/shared/importance_truncated_frac"].values()) > 0.1
    assert all(v == 0 for run, values in EXPECTED.items() if run != "math-off-policy"
               for side in ("low", "high") for v in values[f"train/shared/clip_frac_{side}"].values())


if __name__ == "__main__":  # print this machine's values, to paste above
    import tempfile

    out = {}
    for run in sorted(RIGGED_RUNS):
        with tempfile.TemporaryDirectory() as tmp:
            rigged_run(run, Path(tmp))
            out[run] = {tag: {i: round(v, 6) for i, v in got.items()}
                        for tag, got in pinned_values(Path(tmp)).items()}
            print(run, "done", file=sys.stderr, flush=True)
    print(formatted(out))
