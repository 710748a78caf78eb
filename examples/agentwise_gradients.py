"""Agent-wise vs global advantages on a real model: the Dr. MAS effect in one minute on a CPU.

Two agents share the embedded SmolLM2-135M-Instruct. In one task group each agent samples
``--group`` answers to its own prompt:
- ``judge`` ("is a tomato a fruit? yes or no") earns 1 for yes, else 0;
- ``picker`` ("a number from 1 to 100") earns the number / 10, i.e. 0-10.

Their rewards differ by ~10x in scale. We compute the advantages with the global step-level
baseline (``grpo_step``) and with the agent-wise one (``drmas``), then the PPO-clip loss and
the gradient norm of each agent's samples. Under the global baseline the judge's advantages
all share one large offset (its rewards sit far below the pooled mean), which inflates its
gradient norm; ``drmas`` gives each agent zero-mean, unit-std advantages.

    python examples/agentwise_gradients.py [--model embedded:smollm2-135m-instruct] [--group 8]
"""

from __future__ import annotations

import argparse
import re
import time
from types import SimpleNamespace

import torch

from drmas.algorithms import compute_advantages, policy_loss
from drmas.models import load_causal_lm, resolve_model_path

# (prompt, assistant prefill): the prefill is part of the prompt, so a small model answers
# in the expected form instead of chatting.
AGENTS = {
    "judge": ("Answer yes or no: is a tomato a fruit?", "Answer: "),
    "picker": ("Pick a whole number from 1 to 100.", "My number is "),
}


def reward(agent: str, text: str) -> float:
    if agent == "judge":
        said = re.findall(r"\b(yes|no)\b", text.lower())
        return float(bool(said) and said[0] == "yes")
    words = re.findall(r"\d+", text)
    return min(int(words[0]), 100) / 10 if words else 0.0


def sample(model, tok, prompt: str, prefill: str, n: int, max_new_tokens: int):
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    ids = tok(text + prefill, return_tensors="pt", add_special_tokens=False)
    out = model.generate(
        **ids, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens,
        num_return_sequences=n, pad_token_id=tok.pad_token_id,
    )
    prompt_len = ids["input_ids"].shape[1]
    completions = out[:, prompt_len:]
    # Tokens after the first EOS are padding from generate.
    is_eos = completions == tok.eos_token_id
    mask = (is_eos.cumsum(-1) - is_eos.long()) == 0
    texts = [tok.decode(c[m], skip_special_tokens=True) for c, m in zip(completions, mask)]
    return out, prompt_len, mask, texts


def token_logprobs(model, seqs: torch.Tensor, prompt_len: int) -> torch.Tensor:
    logits = model(seqs).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, seqs[:, prompt_len:, None]).squeeze(-1)


def grad_norm(model) -> float:
    return torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None)).item()


def rollout(model, tok, group: int, max_new_tokens: int):
    """Each agent's ``group`` answers: the sequences and their old log-probs per agent, and one
    sample (task, trajectory, agent, reward, text) per answer, as the estimators read them."""
    rollouts, samples = {}, []
    with torch.no_grad():
        for agent, (prompt, prefill) in AGENTS.items():
            seqs, plen, mask, texts = sample(model, tok, prompt, prefill, group, max_new_tokens)
            rollouts[agent] = (seqs, plen, mask, token_logprobs(model, seqs, plen))
            for j, text in enumerate(texts):
                samples.append(SimpleNamespace(task_uid="t0", traj_uid=j, agent=agent, turn=0,
                                               reward=reward(agent, text), text=text))
    return rollouts, samples


def compare(model, rollouts, samples) -> list[tuple]:
    """Per estimator and agent: reward mean and std, advantage mean and std, and the gradient
    norm of the agent's PPO-clip loss."""
    rows = []
    for estimator in ("grpo_step", "drmas"):
        adv = compute_advantages(samples, estimator)
        for agent, (seqs, plen, mask, old) in rollouts.items():
            idx = [i for i, s in enumerate(samples) if s.agent == agent]
            model.zero_grad(set_to_none=True)
            loss, _ = policy_loss(token_logprobs(model, seqs, plen), old, adv[idx], mask)
            loss.backward()
            r = torch.tensor([samples[i].reward for i in idx])
            rows.append((estimator, agent, r.mean().item(), r.std().item(),
                         adv[idx].mean().item(), adv[idx].std().item(), grad_norm(model)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--group", type=int, default=8, help="answers sampled per agent")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = time.time()
    path = resolve_model_path(args.model)
    model, tok = load_causal_lm(args.model)
    print(f"model {args.model} at {path} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
          f"{time.time() - t0:.1f}s)")
    torch.manual_seed(args.seed)

    rollouts, samples = rollout(model, tok, args.group, args.max_new_tokens)
    for agent in AGENTS:
        shown = [s.text.strip()[:12] for s in samples if s.agent == agent][:6]
        print(f"  {agent:7s} answers: {shown}")

    rows = compare(model, rollouts, samples)
    print(f"\n{'estimator':10s} {'agent':7s} {'reward mean':>11s} {'std':>6s} {'adv mean':>9s} "
          f"{'adv std':>8s} {'grad norm':>10s}")
    for est, agent, rm, rs, am, asd, gn in rows:
        print(f"{est:10s} {agent:7s} {rm:11.2f} {rs:6.2f} {am:9.3f} {asd:8.3f} {gn:10.3f}")
    print(f"\ndone in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
