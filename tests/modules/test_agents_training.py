"""Training through the endpoint in-process, on tiny-random: the samples are the policies' own
(the trainer's log-probs of the recorded tokens are the engine's), an agent rewarded for short
answers learns to answer shorter (an lr-0 control does not), and a frozen policy never changes."""

import lightning as L
import pytest
import torch
from agent_programs import conversation, short_answers, with_tools

from drmas.callbacks import RolloutStats
from drmas.data.datamodule import RolloutDataModule
from drmas.data.rollouts import RolloutConfig, Rollouts
from drmas.workflows.agents import AgentsWorkflow
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.modules.policy_config import OptimSettings, PolicyGeneration, UpdateSettings
from drmas.records import GenerationSettings
from drmas.data.rollout_config import ValidationConfig


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(f'{{"q": "Say something about the number {i}."}}\n' for i in range(8)))
    return str(path)


@pytest.mark.integration  # episode workers and two models (5 s)
def test_the_endpoints_samples_are_the_policies_own_on_two_policies(tasks_file):
    # two model families, two temperatures: each agent's tokens come from its own policy
    module = MultiAgentRL(policies={
        "w": PolicyConfig(model="tiny-random",
                          generation=PolicyGeneration(
                              train=GenerationSettings(temperature=0.7, max_new_tokens=8))),
        "c": PolicyConfig(model="tiny-random-qwen3", chat_template_kwargs={"enable_thinking": False},
                          generation=PolicyGeneration(
                              train=GenerationSettings(temperature=1.0, max_new_tokens=6)))},
        agents={"writer": "w", "critic": "c"}, engine="hf")
    wf = AgentsWorkflow(conversation, ["writer", "critic"], tasks_file, val_share=0)
    try:
        rollouts = Rollouts(wf, RolloutConfig(estimator="drmas", group_size=2, tasks_per_iteration=2),
                            ValidationConfig(tasks=0))
        plan = rollouts.prepare(module, iteration=1)
    finally:
        wf.close()
    assert {s.policy for s in plan.samples} == {"w", "c"} and len(plan.samples) == 8
    assert all(s.reward == pytest.approx(1.0 - len(s.response_ids) / 10) for s in plan.samples if s.valid)
    qwen = module.policies["c"].tokenizer
    critic = [s for s in plan.samples if s.agent == "critic"]
    assert all(qwen.decode(s.prompt_ids).startswith("<|im_start|>user\nSay something") for s in critic)
    checked = 0
    with torch.no_grad():
        for batch in plan.micro_batches:
            policy = module.policies[batch.policy]
            mine, _ = policy.token_logprobs(batch, policy.config.generation.train.temperature)
            mask = batch.response_mask
            torch.testing.assert_close(mine[mask], batch.engine_logprobs[mask], atol=1e-4, rtol=0)
            checked += int(mask.sum())
    assert checked == sum(len(s.response_ids) for s in plan.samples)


def train(tasks_file, tmp_path, lr, iterations=5, frozen_critic=False, seed=1, staleness=0):
    L.seed_everything(seed)  # the engine samples from the global generator
    # temperature 0.1: tiny-random's next-token distribution is uniform over 49k tokens, where no
    # few steps can move the mass of the ~9% of tokens holding a "y"; at 0.1 a few dozen tokens
    # take most of it (the trainer computes log-probs at the same temperature)
    sampling = GenerationSettings(temperature=0.1, max_new_tokens=16)
    policies = {"w": PolicyConfig(model="tiny-random", optim=OptimSettings(lr=lr),
                                  update=UpdateSettings(micro_batch_size=32, ppo_epochs=4),
                                  generation=PolicyGeneration(train=sampling))}
    agents = {"writer": "w"}
    if frozen_critic:
        policies["c"] = PolicyConfig(model="tiny-random", trainable=False,
                                     generation=PolicyGeneration(train=sampling))
        agents["critic"] = "c"
    module = MultiAgentRL(policies=policies, agents=agents, engine="hf")
    # no window: a call waits for every episode's, so the batches (and the sampled tokens) never
    # depend on how fast the threads ran
    wf = AgentsWorkflow(conversation if frozen_critic else short_answers, list(agents), tasks_file,
                        val_share=0, window_ms=10**7)
    dm = RolloutDataModule(wf,
                           rollout=RolloutConfig(estimator="drmas", group_size=8, tasks_per_iteration=4,
                                                 seed=seed, staleness=staleness),
                           validation=ValidationConfig(tasks=0))
    trainer = L.Trainer(accelerator="cpu", max_epochs=iterations, reload_dataloaders_every_n_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[RolloutStats()])
    trainer.fit(module, datamodule=dm)
    return module, [h["rollout/writer/response_tokens_mean"] for h in module.history
                    if "rollout/writer/response_tokens_mean" in h]


@pytest.mark.integration  # by spirit: two 5-iteration training runs (20-40 s on 2 cores)
def test_an_agent_rewarded_for_short_answers_learns_to_answer_shorter(tasks_file, tmp_path):
    _, learned = train(tasks_file, tmp_path, lr=1e-2)
    _, control = train(tasks_file, tmp_path, lr=0.0, iterations=3)  # unmoved weights: 3 draws suffice
    # measured: learned 11.7 7.1 1.1 1.0 1.0 tokens, control 10.7 10.4 10.1
    assert learned[0] > 5 and learned[-1] < 3 and min(control) > 5, (learned, control)


@pytest.mark.integration  # one 8-iteration training run (about a minute on 2 cores)
def test_the_agent_learns_from_rollouts_one_update_behind_as_it_does_on_policy(tasks_file, tmp_path):
    """Staleness 1: iteration k trains on the rollout of the weights after update k-2, played by an HF
    engine process of its own during update k-1, importance-corrected. Over the same 8 iterations
    at lr 3e-3 it answers as short as on-policy. Measured (seed 2): on-policy 9.8 8.6 6.7 7.0 6.2 4.1
    2.4 1.2 tokens; one update behind 10.8 10.9 10.9 7.3 3.2 5.0 3.9 1.2."""
    import os

    from drmas.engines.placement import pin_process

    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:  # the trainer takes half of this process's cores for the run
        module, learned = train(tasks_file, tmp_path, lr=3e-3, iterations=8, seed=2, staleness=1)
    finally:
        pin_process(sorted(cores))
        torch.set_num_threads(threads)
    lags = [h["train/w/staleness_max"] for h in module.history if "train/w/staleness_max" in h]
    weights = [h["train/w/importance_weight_mean"] for h in module.history
               if "train/w/importance_weight_mean" in h]
    assert lags == [0] + [1] * 7 and weights[1] < 0.9  # the lag is there, and weighed
    assert learned[0] > 5 and learned[-1] < 3, learned


@pytest.mark.integration  # two training iterations of two policies through the endpoint
def test_a_frozen_policy_never_changes_while_the_trained_one_moves(tasks_file, tmp_path):
    from drmas.models import load_causal_lm

    module, _ = train(tasks_file, tmp_path, lr=1e-2, iterations=2, frozen_critic=True)
    initial = load_causal_lm("tiny-random")[0].state_dict()
    frozen, trained = module.policies["c"].model.state_dict(), module.policies["w"].model.state_dict()
    assert all(torch.equal(frozen[k], initial[k]) for k in initial)
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)
    assert module.policies["c"].version == 0 and module.policies["c"].reference is None
    assert len(module.optimizers() if isinstance(module.optimizers(), list) else [module.optimizers()]) == 1
    last = [h for h in module.history if "rollout/critic/samples" in h][-1]
    assert (last["rollout/critic/samples"] == 32
            and "train/c/loss" not in {k for h in module.history for k in h})


@pytest.mark.integration  # episode workers and two models (4 s)
def test_tools_reach_each_policy_in_its_own_format(tasks_file):
    pytest.importorskip("vllm.tool_parsers")
    module = MultiAgentRL(policies={
        "w": PolicyConfig(model="tiny-random",
                          generation=PolicyGeneration(train=GenerationSettings(max_new_tokens=4))),
        "c": PolicyConfig(model="tiny-random-qwen3", chat_template_kwargs={"enable_thinking": False},
                          generation=PolicyGeneration(train=GenerationSettings(max_new_tokens=4)))},
        agents={"writer": "w", "critic": "c"}, engine="hf")
    wf = AgentsWorkflow(with_tools, ["writer", "critic"], tasks_file, val_share=0)
    try:
        rollouts = Rollouts(wf, RolloutConfig(estimator="drmas", group_size=2, tasks_per_iteration=1),
                            ValidationConfig(tasks=0))
        plan = rollouts.prepare(module, iteration=1)
    finally:
        wf.close()
    prompts = {s.agent: module.policies[s.policy].tokenizer.decode(s.prompt_ids) for s in plan.samples}
    # tiny-random's template ignores tools: the hermes fallback as text
    assert '<tools>[{"function": {"description": "a + b"' in prompts["writer"]
    assert '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' in prompts["writer"]
    assert "<tool_response>5</tool_response>" in prompts["writer"]
    # Qwen3's template renders them itself
    assert "# Tools" in prompts["critic"] and "<tools>" in prompts["critic"]
    assert "<tool_response>\n5\n</tool_response>" in prompts["critic"]
