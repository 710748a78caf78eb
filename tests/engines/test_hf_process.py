"""The HF engine in a process of its own (rollouts behind the update): it generates what the
in-process HF engine generates from the same weights and seed, takes new weights through the shared
file in chunks, draws reproducibly, and names its failures and its death."""

import os
from types import SimpleNamespace

import pytest
import torch

from drmas.engines.base import FullState
from drmas.engines import HFEngine, hf_process
from drmas.engines.hf_process import HFProcessEngine
from drmas.engines.served import EngineProcessError
from drmas.models import load_causal_lm
from drmas.modules.policy_config import PolicyConfig
from drmas.records import GenerationSettings

pytestmark = pytest.mark.integration  # a process of its own per engine (a few seconds each)


@pytest.fixture
def policy():
    model, tokenizer = load_causal_lm("tiny-random")
    return SimpleNamespace(name="p", config=PolicyConfig(model="tiny-random"), model=model,
                           tokenizer=tokenizer)


def test_it_generates_what_the_in_process_engine_does_after_taking_new_weights(policy, monkeypatch):
    monkeypatch.setattr(hf_process, "BUFFER_BYTES", 2**20)  # below the embedding: several chunks
    with torch.no_grad():  # weights the process's fresh copy does not have
        torch.manual_seed(3)
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine = HFProcessEngine(policy, [0])
    try:
        engine.sync_weights(FullState(policy.model, engine.transfer_dtype))
        prompts = [policy.tokenizer("The sky is")["input_ids"], policy.tokenizer("Two and two")["input_ids"]]
        params = GenerationSettings(temperature=1.0, max_new_tokens=6)
        engine.reseed(11)
        theirs = engine.generate(prompts, 2, params)
        torch.manual_seed(11)
        ours = HFEngine(policy.model, policy.tokenizer).generate(prompts, 2, params)
        engine.reseed(11)
        again = engine.generate(prompts, 2, params)
    finally:
        engine.close()
    flat = lambda out: [c for row in out for c in row]  # noqa: E731
    assert [c.response_ids for c in flat(theirs)] == [c.response_ids for c in flat(ours)]
    for a, b in zip(flat(theirs), flat(ours)):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4) and a.text == b.text
    assert [c.logprobs for c in flat(again)] == [c.logprobs for c in flat(theirs)]  # its own generator
    assert engine.process.proc.poll() is not None  # closed and reaped


def test_a_failing_request_and_a_dead_process_are_named(policy):
    engine = HFProcessEngine(policy, [0])
    try:
        failed = r"in the HF engine process of p \(pid \d+\); its traceback"
        with pytest.raises(EngineProcessError, match=failed):
            engine._call("load_chunk", names=[], dtype_names=[], shapes=[], offsets=[])  # before any map
        os.kill(engine.pid, 9)
        died = rf"the HF engine process of p \(pid {engine.pid}\) ended \(exit code -9\) during 'reseed'"
        with pytest.raises(EngineProcessError, match=died):
            engine.reseed(1)
    finally:
        engine.close()
