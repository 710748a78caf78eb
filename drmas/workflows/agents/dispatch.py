"""The dispatcher: inside ``rollout()``, in the thread that called it, it answers the endpoint's
calls with the ``generate`` function of that rollout, in batches.

It calls ``generate`` when every running episode is waiting on a call, or once the oldest
pending call has waited ``window_s``, with all pending calls: 16 episodes in flight cost about
one batched call per agent and round. Calls are served in episode order, so a resumed run makes
the same calls. Identical prompts (every episode's first call of a task) go out as one request.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections import defaultdict
from typing import Any, Callable, Sequence

from drmas.workflows.agents.episodes import EpisodeRun
from drmas.workflows.agents.protocol import ApiError, Reply, message_content
from drmas.workflows.agents.server import Call
from drmas.workflows.base import sample_groups
from drmas.records import Completion, GenerateFn
from drmas.tool_calls import call_text, parse_tool_calls, special_marker, tools_parsable

__all__ = ["Dispatcher"]

_POLL_S = 0.25  # the longest wait without looking at timeouts and a preemption


class Dispatcher:
    """Answers calls until every episode has ended; counts what it did in :attr:`counts`."""

    def __init__(self, inbox: queue.Queue, generate: GenerateFn, window_s: float) -> None:
        self.inbox, self.generate, self.window_s = inbox, generate, window_s
        self.counts: dict[str, float] = defaultdict(float)
        self._tool_formats: dict[str, Any] = {}
        self._tokenizers: dict[str, Any] = {}
        self._reasoners: dict[str, Any] = {}
        self._markers: dict[str, int | None] = {}

    def run(self, runs: Sequence[EpisodeRun], schedule: Callable[[], None],
            on_end: Callable[[EpisodeRun], None] | None = None) -> None:
        """Serve ``runs``' calls until all have ended or timed out; ``schedule`` (the worker pool's)
        starts queued episodes and ends those past their deadline. An engine failure (or a
        preemption, raised by ``generate``) answers every pending call with a 500 and is raised."""
        pending: list[Call] = []
        first_at: float | None = None
        ended: set[int] = set()
        try:
            while True:
                schedule()
                now = time.monotonic()
                for run in runs:
                    if run.done and id(run) not in ended:
                        ended.add(id(run))
                        if on_end is not None:
                            on_end(run)
                pending = [c for c in pending if self._open(c)]
                first_at = first_at if pending else None
                running = {run.session.index for run in runs if run.running}
                if len(ended) == len(runs) and not pending:
                    return
                waiting = {c.session.index for c in pending}
                if pending and (running <= waiting or now - first_at >= self.window_s):
                    self._serve(pending)
                    pending, first_at = [], None
                    continue
                self.generate.check_stop()  # a preemption ends the rollout even while no episode calls
                wait = _POLL_S if first_at is None else max(0.0, first_at + self.window_s - now)
                deadlines = [run.deadline - now for run in runs if run.running]
                for item in self._take(min([wait, *deadlines, _POLL_S])):
                    if isinstance(item, Call):
                        pending.append(item)
                        first_at = time.monotonic() if first_at is None else first_at
        except BaseException as err:
            for call in pending + [c for c in self._take(0) if isinstance(c, Call)]:
                call.answer(ApiError(500, f"the rollout stopped: {type(err).__name__}: {err}",
                                     "rollout_stopped"))
            raise  # the workflow ends every session, so later calls are answered 410

    def _take(self, timeout: float) -> list[Any]:
        """Whatever is in the inbox, waiting up to ``timeout`` for the first item."""
        items = []
        try:
            items.append(self.inbox.get(timeout=max(timeout, 0.0)) if timeout > 0
                         else self.inbox.get_nowait())
            while True:
                items.append(self.inbox.get_nowait())
        except queue.Empty:
            return items

    def _open(self, call: Call) -> bool:
        """Whether the call's episode still takes answers (else it is answered 410 now)."""
        if call.session.open:
            return True
        self.counts["endpoint/late_calls"] += 1  # its episode ended while it waited
        call.answer(ApiError(410, f"episode {call.session.id!r} has ended", "episode_gone"))
        return False

    def _fits(self, call: Call) -> bool:
        """Whether the policy's chat template takes the messages and the prompt and its response
        fit the agent's context (else the call alone is answered 400; the run goes on)."""
        prompt = call.request.prompt
        try:  # renders the messages: a template may refuse them (roles out of order, a late system turn)
            tokens = self.generate.prompt_tokens(call.request.agent, prompt)
        except Exception as err:  # noqa: BLE001 - a template raises what its author chose
            self.counts["endpoint/template_errors"] += 1
            call.answer(ApiError(400, f"the chat template of agent {call.request.agent!r}'s policy rejected "
                                 f"the messages: {type(err).__name__}: {err}", "chat_template_error",
                                 "messages"))
            return False
        if call.request.tools and not self._takes_tools(call):
            return False
        if call.request.logprobs and self._tokenizer(call.request.agent) is None:
            call.answer(ApiError(400, f"logprobs: true needs agent {call.request.agent!r}'s tokenizer, which "
                                 "its generate function does not give", "logprobs_unavailable", "logprobs"))
            return False
        settings = (call.session.settings or {}).get(call.request.agent)
        context = call.session.contexts.get(call.request.agent)
        if tokens is None or settings is None or context is None:
            return True
        budget = prompt.max_new_tokens or settings.max_new_tokens
        if tokens + budget <= context:
            return True
        call.answer(ApiError(
            400, f"this model's maximum context length is {context} tokens; the messages "
            f"take {tokens} and the completion may take {budget} (lower max_tokens or shorten the messages)",
            "context_length_exceeded", "messages"))
        return False

    def _takes_tools(self, call: Call) -> bool:
        """Whether the agent's calls can be parsed (else the call is answered 400)."""
        agent = call.request.agent
        if agent not in self._tool_formats:
            self._tool_formats[agent] = self.generate.tool_format(agent)
        why = None
        if self._tool_formats[agent] is None:
            why = f"agent {agent!r} is served by a generate function that parses no tool calls"
        else:
            why = tools_parsable(self._tool_formats[agent][1])
        if why is not None:
            call.answer(ApiError(400, why, "tools_unavailable", "tools"))
        return why is None

    def _reply(self, call: Call, completion: Completion) -> Reply:
        """What the client is shown of a completion: the thinking, the content and the calls parsed
        out of it."""
        agent = call.request.agent
        settings = (call.session.settings or {}).get(agent)
        stops = [*call.request.prompt.stop, *(settings.stop if settings else ())]
        content = message_content(completion, stops)
        logprobs = self._token_logprobs(agent, completion) if call.request.logprobs else None
        reasoning, answer = self._reasoning(agent, content)
        shown = dict(logprobs=logprobs, reasoning=reasoning, full=content if reasoning is not None else None)
        if not call.request.tools:
            return Reply(completion, answer, **shown)
        fmt, tokenizer = self._tool_formats[agent]
        if agent not in self._markers:
            self._markers[agent] = special_marker(tokenizer, fmt)
        text = answer
        if self._markers[agent] is not None:  # the call's marker is a special token: read from the tokens
            raw = call_text(tokenizer, completion.response_ids, fmt, self._markers[agent])
            text = message_content(dataclasses.replace(completion, text=raw), stops)
        parsed = parse_tool_calls(text, fmt, tokenizer, call.request.tools)
        if not parsed.calls and not parsed.malformed:
            parsed.content = answer
        self.counts["endpoint/tool_calls"] += len(parsed.calls)
        self.counts["endpoint/tool_call_errors"] += parsed.malformed
        return Reply(completion, parsed.content, parsed.calls, parsed.malformed, **shown)

    def _reasoning(self, agent: str, content: str) -> tuple[str | None, str]:
        """``(thinking, answer)`` of a reply that closed a ``<think>`` block, by vLLM's ``qwen3``
        reasoning parser, for a policy whose template thinks; ``(None, content)`` otherwise (a reply
        without the closing tag keeps its text whole: with thinking off there is none)."""
        if "</think>" not in content:
            return None, content
        if agent not in self._reasoners:
            tokenizer = self._tokenizer(agent)
            self._reasoners[agent] = None
            if tokenizer is not None and "<think>" in (getattr(tokenizer, "chat_template", None) or ""):
                try:
                    from vllm.reasoning import ReasoningParserManager

                    qwen3 = ReasoningParserManager.get_reasoning_parser("qwen3")
                    self._reasoners[agent] = qwen3(tokenizer)
                except ImportError:
                    pass
        parser = self._reasoners[agent]
        if parser is None:
            return None, content
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        request = ChatCompletionRequest(model="drmas", messages=[])
        thinking, answer = parser.extract_reasoning(content, request)
        return thinking, (answer or "").lstrip()

    def _tokenizer(self, agent: str) -> Any:
        if agent not in self._tokenizers:
            self._tokenizers[agent] = self.generate.tokenizer(agent)
        return self._tokenizers[agent]

    def _token_logprobs(self, agent: str, completion: Completion) -> list[dict[str, Any]]:
        """Every generated token (the stop string and call markup included: what was sampled) with
        its sampling log-prob, as text decoded alone (a token holding part of a character shows
        the replacement character)."""
        tokenizer = self._tokenizer(agent)
        out = []
        for token_id, logprob in zip(completion.response_ids, completion.logprobs):
            text = tokenizer.decode([token_id])
            out.append({"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")),
                        "top_logprobs": []})
        return out

    def _serve(self, calls: list[Call]) -> None:
        groups: dict[tuple[str, int], list[Call]] = defaultdict(list)
        for call in sorted(calls, key=lambda c: (c.session.index, c.seq)):
            if self._fits(call):
                groups[(call.request.agent, call.request.n)].append(call)
        for (agent, n), group in groups.items():
            outs = sample_groups(self._counted, agent, [c.request.prompt for c in group], n)
            self.counts["endpoint/requests"] += len(group)
            for call, completions in zip(group, outs):
                self.counts["endpoint/ignored_fields"] += len(call.request.ignored)
                self.counts["endpoint/structured_outputs"] += call.request.structured
                call.answer([self._reply(call, c) for c in completions])

    def _counted(self, agent: str, prompts: Sequence[Any], n: int) -> Any:
        self.counts["endpoint/engine_calls"] += 1
        self.counts["endpoint/samples"] += n * len(prompts)
        return self.generate(agent, prompts, n)
