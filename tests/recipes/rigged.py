"""A recipe run whose rewards differ within every group: ``rigged.py <recipe> fit ...``.

tiny-random never writes a well-formed action, so every sample of a recipe run gets the same
reward and every advantage is zero: such a run pins the entropy bonus and nothing of the RL
maths. The ``rigged`` engine (``--model.engine rigged``) replies from a script instead, with a
well-formed or a malformed reply: the two alternate over the times a prompt is seen (so the
episodes of one task, which share their first prompt, split), starting from a parity drawn from
the prompt's own text (so later turns, whose prompts differ, split too), each reply chosen by
what the prompt asks for (its tag, its code fence, its ``\\boxed{}``). Rewards then come
from the workflow's own reward path and differ within each group, so the advantages, the loss,
the clip fraction and the gradient norm all carry the estimator's and the loss's arithmetic.

Its log-probs are the policy's own: each reply is scored by the model in one forward pass at the
sampling temperature, so on the fp32 HF engine the importance weights are 1. With
``DRMAS_RIG_DRIFT=d`` the engine reports the log-prob of a reply's token i lowered by ``d * i``, a
behaviour policy that drifts from the trained one along a reply: the importance weights
``exp(d * i)`` then exceed the cap at the end of longer replies, and the cap truncates them.
"""

import os
import sys
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from oracle import SOLUTIONS  # noqa: E402

from drmas.engines import ENGINES, HFEngine  # noqa: E402
from drmas.engines.base import check_request, per_prompt  # noqa: E402
from drmas.recipes import main  # noqa: E402
from drmas.records import Completion  # noqa: E402

# (what the prompt ends with, the well-formed reply, the malformed one): the first that matches
PREFILLED = [("approve</verify> or <verify>reject</verify>", "approve</verify> Right.", "maybe</verify>"),
             ("<verify>", "no</verify>", "maybe</verify>"),
             ("<search>", "Dorvik Alsenne</search>", "</search>"),
             ("<answer>", "Lisbon</answer>", "</answer>"),
             ("<actions>", "D, R</actions>", "jump</actions>"),
             ("<verdict>", "A</verdict>", "C</verdict>"),
             ("<tests>\n", "<input>\n1\n</input>\n<output>\n1\n</output>\n</tests>", "</tests>")]

RAMBLE = "Let me think about this a little longer. " * 16
"""A reply without the asked-for form that runs past any length limit the tests set (cut: invalid)."""


def reply(prompt: str, good: bool) -> str:
    """The scripted reply to ``prompt`` (the decoded chat up to the generation point)."""
    asked = prompt.rsplit("<|im_start|>user", 1)[-1]
    for end, well, mal in PREFILLED:
        if prompt.endswith(end) or (end in asked and prompt.endswith("<verify>")):
            return well if good else mal
    if prompt.endswith("```python\n"):
        solution = next((s for q, s in SOLUTIONS.items() if q in asked), None)
        if solution is not None:  # the coder: the embedded problem's reference solution
            return solution + "\n```" if good else "print(\n```"
        return "print('D, R')\n```" if good else "print(\n```"
    if "<verify>approve</verify>" in asked:
        return "<verify>approve</verify> Right." if good else RAMBLE
    if "\\boxed{" in asked:
        return "So the answer is \\boxed{7}." if good else RAMBLE
    raise ValueError(f"the rig has no reply for a prompt ending {prompt[-200:]!r}")


@ENGINES.register("rigged")
class RiggedEngine(HFEngine):
    def generate(self, prompts, n, params, stops=None, max_new_tokens=None):
        check_request(prompts, n, params)
        _, budgets = per_prompt(prompts, params, stops, max_new_tokens)
        drift = float(os.environ.get("DRMAS_RIG_DRIFT", "0"))
        eos = min(self._eos_ids())
        seen = self.__dict__.setdefault("seen", {})  # times each prompt was answered
        out = []
        for ids, budget in zip(prompts, budgets):
            text = self.tokenizer.decode(ids)
            row = []
            for _ in range(n):
                times = seen[tuple(ids)] = seen.get(tuple(ids), -1) + 1
                good = (times + zlib.crc32(text.encode())) % 2 == 0
                tokens = self.tokenizer(reply(text, good), add_special_tokens=False)["input_ids"] + [eos]
                finish = "stop" if len(tokens) <= budget else "length"
                tokens = tokens[:budget]
                logprobs = self.score(list(ids), tokens, params.temperature)
                logprobs = [lp - drift * i for i, lp in enumerate(logprobs)]
                shown = tokens[:-1] if finish == "stop" else tokens
                row.append(Completion(list(ids), tokens, logprobs,
                                      self.tokenizer.decode(shown, skip_special_tokens=True), finish))
            out.append(row)
        return out

    @torch.no_grad()
    def score(self, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
        """The model's log-probs of ``tokens`` after ``prompt``, at the sampling temperature."""
        was_training = self.model.training
        self.model.eval()
        try:
            ids = torch.tensor([prompt + tokens], device=next(self.model.parameters()).device)
            logits = self.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        finally:
            self.model.train(was_training)
        logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
        return logp.gather(1, torch.tensor(tokens, device=logp.device)[:, None])[:, 0].tolist()


if __name__ == "__main__":
    main(sys.argv.pop(1))
