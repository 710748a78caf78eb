"""A scripted engine: a ``generate`` function whose completions a test writes."""

from drmas.envs.base import Completion
from drmas.records import ScriptedGenerate


class Script(ScriptedGenerate):
    """``fn(agent, prompt, i)`` writes the i-th of n completions (after the prompt's prefill);
    every call is recorded."""

    def __init__(self, fn, train=True):
        super().__init__(fn, train)
        self.calls = []

    def __call__(self, agent, prompts, n):
        self.calls.append((agent, list(prompts), n))
        return [[Completion([1], [2, 3], [-0.5, -0.5], p.prefill + self.fn(agent, p, i), "stop")
                 for i in range(n)]
                for p in prompts]

    def prompts(self, agent):
        """The last user message of every prompt ``agent`` was given, in order."""
        return [p.messages[-1][1] for a, ps, _ in self.calls if a == agent for p in ps]


class HermesScript(Script):
    """A scripted engine whose answers the endpoint parses for tool calls in the hermes format,
    with tiny-random's tokenizer (loaded once)."""

    tokenizer = None

    def tool_format(self, agent):
        if HermesScript.tokenizer is None:
            from drmas.models import load_tokenizer

            HermesScript.tokenizer = load_tokenizer("tiny-random")
        return "hermes", HermesScript.tokenizer
