"""The policy-swap probe's generate function: each agent answered by another agent's policy."""

from __future__ import annotations

from typing import Any, Sequence

from drmas.records import GenerateFn

__all__ = ["Rerouted"]


class Rerouted:
    """A generate function whose agents are answered by other agents' policies (the swap
    probe); its settings and prompt lengths are the partner's too."""

    def __init__(self, generate: GenerateFn, partner: dict[str, str]) -> None:
        self.generate, self.partner = generate, partner
        self.train = generate.train

    def __call__(self, agent: str, prompts: Sequence[Any], n: int) -> Any:
        return self.generate(self.partner[agent], prompts, n)

    def settings(self, agent: str) -> Any:
        return self.generate.settings(self.partner[agent])

    def context_length(self, agent: str) -> int | None:
        return self.generate.context_length(self.partner[agent])

    def prompt_tokens(self, agent: str, prompt: Any) -> int | None:
        return self.generate.prompt_tokens(self.partner[agent], prompt)

    def tool_format(self, agent: str) -> Any:
        return self.generate.tool_format(self.partner[agent])

    def tokenizer(self, agent: str) -> Any:
        return self.generate.tokenizer(self.partner[agent])

    def check_stop(self) -> None:
        self.generate.check_stop()
