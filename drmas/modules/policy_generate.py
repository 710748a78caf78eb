"""The ``generate`` function the workflows call: an agent's prompts on its policy's engine, with the
policy's chat template and generation settings (:class:`PolicyGenerate`); the chat prompt's token ids
(:func:`encode_prompt`); the engine call that names the policy and the agent when it fails
(:func:`run_engine`); and the clock of each engine's busy time (:class:`BusyClock`)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any, Sequence

from drmas.engines import EngineError
from drmas.records import ChatPrompt, Completion, GenerationSettings
from drmas.tool_calls import fallback_messages, resolve_format

__all__ = ["BusyClock", "PolicyGenerate", "encode_prompt", "run_engine"]


class PolicyGenerate:
    """``generate(agent, prompts, n)`` on the agent's policy with its train or eval generation settings, and
    what an endpoint needs to answer within that policy (:meth:`settings`, :meth:`prompt_tokens`)."""

    def __init__(self, engines: Any, train: bool) -> None:
        """``engines``: the trainer's :class:`~drmas.modules.engine_routing.RolloutEngines` (its ``engine``,
        ``busy``, ``built``, ``name`` and ``host``)."""
        self.engines, self.module, self.train = engines, engines.host, train

    def _policy(self, agent: str) -> Any:
        return self.module.any_policy(self.module.policy_of(agent))

    def _params(self, policy: Any) -> Any:
        return policy.config.generation.train if self.train else policy.config.generation.eval

    def check_stop(self) -> None:
        """Raise when this rank was preempted (SIGTERM)."""
        self.module.stop_signal.raise_if_requested()

    def __call__(self, agent: str, prompts: Sequence[ChatPrompt], n: int) -> list[list[Completion]]:
        if not prompts:
            return []
        self.check_stop()  # preempted: stop before the next request, not after the rollout
        policy = self._policy(agent)
        params = self._params(policy)
        # each prompt its own stop strings and length, within the policy's budget
        stops = [list(dict.fromkeys([*params.stop, *p.stop])) for p in prompts]
        budgets = [params.max_new_tokens if p.max_new_tokens is None
                   else min(p.max_new_tokens, params.max_new_tokens)
                   for p in prompts]  # a budget below 1 is refused by the engine, naming the prompt
        config = policy.config
        ids = [encode_prompt(policy.tokenizer, p, config.chat_template_kwargs, config.tool_format)
               for p in prompts]
        with self.engines.busy.setdefault(policy.name, BusyClock()):
            try:
                outs = run_engine(self.engines.engine(policy.name), self.engines.name, policy.name, agent,
                                  ids, n, params, stops, budgets)
            except EngineError:
                # preempted meanwhile: the stop closes engines (under per-policy pools, another rank's
                # too) while a rollout behind the update still plays; that is the stop, not a failure
                self.check_stop()
                raise
        # what the agent's parser reads: the prefill it was given, then the response
        return [[dataclasses.replace(c, text=p.prefill + c.text) for c in completions]
                for p, completions in zip(prompts, outs)]

    def settings(self, agent: str) -> GenerationSettings:
        """The agent's policy's sampling and length budget."""
        return self._params(self._policy(agent))

    def context_length(self, agent: str) -> int | None:
        """The agent's engine's context length, else its model's position limit."""
        policy = self._policy(agent)
        engine = self.engines.built.get(policy.name)
        return (getattr(engine, "context_length", None)
                or getattr(policy.model_config, "max_position_embeddings", None))

    def prompt_tokens(self, agent: str, prompt: ChatPrompt) -> int:
        policy = self._policy(agent)
        return len(encode_prompt(policy.tokenizer, prompt, policy.config.chat_template_kwargs,
                                 policy.config.tool_format))

    def tool_format(self, agent: str) -> tuple[str, Any]:
        policy = self._policy(agent)
        return resolve_format(policy.config.tool_format, policy.tokenizer.chat_template)[0], policy.tokenizer

    def tokenizer(self, agent: str) -> Any:
        return self._policy(agent).tokenizer


class BusyClock:
    """Seconds of requests in flight (``with clock:`` around each): requests that overlap, from the
    episode loop's threads, count once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open, self._since, self._total = 0, 0.0, 0.0

    def __enter__(self) -> None:
        with self._lock:
            if not self._open:
                self._since = time.perf_counter()
            self._open += 1

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self._open -= 1
            if not self._open:
                self._total += time.perf_counter() - self._since

    def take(self) -> float:
        """The seconds since the last call (a request still in flight counts up to now)."""
        with self._lock:
            now = time.perf_counter()
            total = self._total + (now - self._since if self._open else 0.0)
            self._total, self._since = 0.0, now
            return total


def encode_prompt(tokenizer, prompt: ChatPrompt, template_kwargs: dict[str, Any] | None = None,
                  tool_format: str = "auto") -> list[int]:
    """Token ids of the chat prompt with the generation header and the assistant prefill; tools
    and tool calls rendered by the template where it takes them (earlier calls' arguments as
    objects, as serving engines pass them: templates that apply ``tojson`` would show a string encoded
    twice), else in the hermes format. A message's ``name`` is given to a template that reads it;
    elsewhere it prefixes a user's, system's or tool's content and is left out of an assistant's
    (whose content is what the policy itself wrote)."""
    messages = [{"role": r, "content": c} for r, c in prompt.messages]
    template = tokenizer.chat_template or ""
    takes_name = any(f"message{k}" in template for k in (".name", "['name']", '["name"]'))
    for m, extra in zip(messages, prompt.fields):
        m.update(json.loads(extra) if extra else {})
        name = m.get("name") if not takes_name else None
        if name is not None:
            del m["name"]
            if m["role"] != "assistant":
                m["content"] = f"{name}: {m['content']}"
    kwargs = {**(template_kwargs or {}),  # the request's own variables over the policy's
              **(json.loads(prompt.template_kwargs) if prompt.template_kwargs else {})}
    if prompt.tools or any("tool_calls" in m or "tool_call_id" in m for m in messages):
        tools = [json.loads(t) for t in prompt.tools]
        if resolve_format(tool_format, template)[1]:
            kwargs["tools"] = tools or None
            for m in messages:
                for c in m.get("tool_calls") or ():
                    fn = c.get("function") or {}
                    if isinstance(fn.get("arguments"), str):
                        fn["arguments"] = _json_object(fn["arguments"])
        else:
            messages = fallback_messages(messages, tools)
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    ) + prompt.prefill
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _json_object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # as the program sent it


def run_engine(engine: Any, kind: str, policy: str, agent: str, ids: list[list[int]], n: int, params: Any,
               stops: Any = None, max_new_tokens: Any = None) -> Any:
    """``engine.generate(ids, n, params, stops, max_new_tokens)``; any failure re-raised as
    :class:`EngineError` naming the policy and the agent, so a lost device or a bad request says
    whose rollout it ended."""
    try:
        return engine.generate(ids, n, params, stops, max_new_tokens)
    except Exception as err:
        raise EngineError(f"the {kind} engine of policy {policy!r} failed generating for agent {agent!r} "
                          f"({len(ids)} prompts x {n}): {type(err).__name__}: {err}") from err
