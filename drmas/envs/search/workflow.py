"""The hierarchical search workflow of Dr. MAS: a verifier routes, a searcher searches, an
answerer answers.

Each turn (at most ``max_turns``) the verifier reads the question and the search history and
says ``<verify>yes</verify>`` or ``<verify>no</verify>``. On no, the searcher writes
``<search>query</search>`` and the retriever's top-k passages join the history as
``<information>..</information>``; on the last turn a no hands over to the answerer anyway, so
every episode ends with an answer. On yes the answerer writes ``<answer>..</answer>`` and the
episode ends.

Rewards. Team reward: exact match of the answer with a gold answer (normalised: lowercase, no
punctuation, no articles, single spaces). Role (local) rewards: verifier = routing correct
(yes exactly when a gold answer already appears in the gathered information); searcher = its
passages contain a gold answer; answerer = exact match. A malformed action gets
``-format_penalty`` as local reward (a malformed verify counts as no, a malformed search
retrieves nothing, a malformed answer is wrong).

- ``parallel`` mode: every sample of a trajectory gets ``alpha * team + local``, where local is
  the format penalty, plus the role reward when ``role_rewards`` is on (off by default, as in
  Dr. MAS).
- ``tree`` mode (AT-GRPO): for each (task, turn, agent) one prompt from the current state,
  ``n`` candidates, each scored on its own: role reward + format penalty, plus
  ``alpha * team`` when the episode ends at that step (the answerer). All candidates are
  recorded with the same ``env_uid`` (the task's tree); the best is executed (ties: the lowest
  index, or a seeded random one with ``tie_break="random"``) and the next prompt is built from
  the advanced state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

from drmas.algorithms import mix_rewards
from drmas.data.experience import Experience
from drmas.envs.base import (
    WORKFLOWS,
    ChatPrompt,
    Completion,
    EpisodeResult,
    GenerateFn,
    PromptTemplate,
    RolloutResult,
    Workflow,
    pick_best,
    sample_each,
    split_tasks,
)
from drmas.envs.search.answers import contains_answer, exact_match
from drmas.envs.search.data import SearchTask, load_corpus, load_search_r1, synthetic_world
from drmas.envs.search.prompts import default_templates, format_information, parse_answer, parse_search, parse_verify
from drmas.envs.search.retrieval import Retriever, make_retriever

__all__ = ["SearchWorkflow"]

AGENTS = ("verifier", "searcher", "answerer")


@dataclass
class _Episode:
    task: SearchTask
    traj_uid: str
    env_uid: str
    history: list[tuple[str, list[str]]] = field(default_factory=list)
    turn: int = 0
    answer: str | None = None
    done: bool = False
    samples: list[Experience] = field(default_factory=list)

    @property
    def information(self) -> str:
        return format_information(self.history)

    def gathered_text(self) -> str:
        return " ".join(p for _, ps in self.history for p in ps)


@WORKFLOWS.register("search")
class SearchWorkflow(Workflow):
    agents = AGENTS

    def __init__(
        self,
        world_seed: int = 0,
        train_file: str | None = None,
        val_file: str | None = None,
        test_file: str | None = None,
        corpus_file: str | None = None,
        retriever: str = "bm25",
        retriever_url: str | None = None,
        topk: int = 3,
        max_turns: int = 4,
        alpha: float = 1.0,
        format_penalty: float = 0.1,
        role_rewards: bool = False,
        think: bool = False,
        tie_break: str = "first",
        templates: dict[str, PromptTemplate] | None = None,
    ) -> None:
        """
        Args:
            world_seed: seed of the embedded synthetic world (questions and corpus) used when
                no files are given.
            train_file: Search-R1-style JSONL/parquet of training questions (replaces the
                embedded train split); likewise ``val_file`` and ``test_file``.
            val_file: validation questions file.
            test_file: test questions file.
            corpus_file: JSONL corpus (``contents`` per line) for the in-process retrievers;
                required with question files unless ``retriever="http"``.
            retriever: ``bm25`` (in-process), ``dense`` (MiniLM), or ``http`` (a
                Search-R1-compatible server at ``retriever_url``).
            retriever_url: full URL of the server's ``/retrieve`` endpoint for ``http``.
            topk: passages returned per search.
            max_turns: turns per episode (each: verifier, then searcher or answerer).
            alpha: weight of the team reward in ``alpha * team + local``.
            format_penalty: magnitude of the local penalty for a malformed action.
            role_rewards: in parallel mode, add the role rewards to the local term.
            think: prefill the searcher and answerer with ``<think>`` (the parser accepts an
                optional think block either way).
            tie_break: how tree sampling picks among equally scored candidates: ``first``
                (lowest index) or ``random`` (seeded).
            templates: per-agent prompt templates replacing the defaults (by agent name).
        """
        if tie_break not in ("first", "random"):
            raise ValueError(f"tie_break must be 'first' or 'random', got {tie_break!r}")
        if max_turns < 1 or topk < 1:
            raise ValueError(f"max_turns and topk must be >= 1, got {max_turns}, {topk}")
        unknown = set(templates or {}) - set(AGENTS)
        if unknown:
            raise ValueError(f"templates for unknown agents {sorted(unknown)}; agents: {list(AGENTS)}")
        self.topk, self.max_turns, self.alpha = topk, max_turns, alpha
        self.format_penalty, self.role_rewards, self.tie_break = format_penalty, role_rewards, tie_break
        self.templates = {**default_templates(think), **(templates or {})}

        files = {"train": train_file, "val": val_file, "test": test_file}
        world = None
        if not all(files.values()) or (corpus_file is None and retriever != "http"):
            world = synthetic_world(seed=world_seed)
        self._splits = {
            split: tuple(load_search_r1(path)) if path else world.splits[split]  # type: ignore[union-attr]
            for split, path in files.items()
        }
        if retriever == "http":
            self.retriever: Retriever = make_retriever("http", url=retriever_url)
        else:
            if any(files.values()) and corpus_file is None:
                raise ValueError("question files need a corpus_file for the in-process retrievers")
            corpus = load_corpus(corpus_file) if corpus_file else list(world.corpus)  # type: ignore[union-attr]
            self.retriever = make_retriever(retriever, corpus)

    def tasks(self, split: str) -> Sequence[SearchTask]:
        return split_tasks(self._splits, split)

    # ---- one agent step ---------------------------------------------------------------------

    def _prompt(self, agent: str, ep: _Episode) -> ChatPrompt:
        return self.templates[agent].render(question=ep.task.question, information=ep.information)

    def _record(self, ep: _Episode, agent: str, c: Completion, valid: bool, role: float) -> Experience:
        return Experience(
            task_uid=ep.task.uid, traj_uid=ep.traj_uid, env_uid=ep.env_uid, agent=agent, turn=ep.turn,
            policy="", prompt_ids=c.prompt_ids, response_ids=c.response_ids, engine_logprobs=c.logprobs,
            text=c.text, valid=valid, info={"role_reward": role},
        )

    def _format_term(self, valid: bool) -> float:
        return 0.0 if valid else -self.format_penalty

    def _search(self, queries: list[str | None]) -> list[list[str]]:
        real = [q for q in queries if q is not None]
        hits = iter(self.retriever.search(real, self.topk) if real else [])
        return [[h.text for h in next(hits)] if q is not None else [] for q in queries]

    def _verify_role(self, ep: _Episode, says_yes: bool) -> float:
        return float(says_yes == contains_answer(ep.gathered_text(), ep.task.answers))

    @staticmethod
    def _team(ep: _Episode) -> float:
        return float(ep.answer is not None and exact_match(ep.answer, ep.task.answers))

    def _next_agent(self, ep: _Episode, says_yes: bool) -> str:
        return "answerer" if says_yes or ep.turn == self.max_turns - 1 else "searcher"

    # ---- parallel ---------------------------------------------------------------------------

    def rollout(
        self, tasks: Sequence[SearchTask], generate: GenerateFn, *, n: int, mode: str = "parallel", seed: int = 0
    ) -> RolloutResult:
        if mode == "parallel":
            eps = [_Episode(t, f"{t.uid}#{j}", f"{t.uid}#{j}") for t in tasks for j in range(n)]
            self._play_parallel(eps, generate)
        elif mode == "tree":
            eps = [_Episode(t, f"{t.uid}#tree", f"{t.uid}#tree") for t in tasks]
            self._play_tree(eps, generate, n, random.Random(seed))
        else:
            raise ValueError(f"mode must be 'parallel' or 'tree', got {mode!r}")
        episodes = []
        for ep in eps:
            team = self._team(ep)
            episodes.append(EpisodeResult(ep.task.uid, ep.traj_uid, team > 0, ep.turn + 1, team, {"answer": ep.answer}))
        return RolloutResult([s for ep in eps for s in ep.samples], episodes)

    def _play_parallel(self, eps: list[_Episode], generate: GenerateFn) -> None:
        while active := [ep for ep in eps if not ep.done]:
            comps = sample_each(generate, "verifier", [self._prompt("verifier", ep) for ep in active])
            route: dict[str, list[_Episode]] = {"searcher": [], "answerer": []}
            for ep, c in zip(active, comps):
                yes = parse_verify(c.text)
                ep.samples.append(self._record(ep, "verifier", c, yes is not None, self._verify_role(ep, bool(yes))))
                route[self._next_agent(ep, bool(yes))].append(ep)

            comps = sample_each(generate, "answerer", [self._prompt("answerer", ep) for ep in route["answerer"]])
            for ep, c in zip(route["answerer"], comps):
                answer = parse_answer(c.text)
                ok = answer is not None and exact_match(answer, ep.task.answers)
                ep.samples.append(self._record(ep, "answerer", c, answer is not None, float(ok)))
                ep.answer, ep.done = answer, True

            searchers = route["searcher"]
            comps = sample_each(generate, "searcher", [self._prompt("searcher", ep) for ep in searchers])
            queries = [parse_search(c.text) for c in comps]
            for ep, c, q, passages in zip(searchers, comps, queries, self._search(queries)):
                found = float(contains_answer(" ".join(passages), ep.task.answers))
                ep.samples.append(self._record(ep, "searcher", c, q is not None, found))
                if q is not None:
                    ep.history.append((q, passages))
                ep.turn += 1

        for ep in eps:
            team = self._team(ep)
            for s in ep.samples:
                local = self._format_term(s.valid) + (s.info["role_reward"] if self.role_rewards else 0.0)
                s.team_reward, s.local_reward = team, local
                s.reward = mix_rewards(team, local, self.alpha)

    # ---- tree -------------------------------------------------------------------------------

    def _score(self, s: Experience, role: float, team: float | None) -> None:
        """A tree candidate's score: role reward + format term (+ alpha * team if it ends the episode)."""
        s.team_reward = team if team is not None else 0.0
        s.local_reward = role + self._format_term(s.valid)
        s.reward = mix_rewards(s.team_reward, s.local_reward, self.alpha)

    def _play_tree(self, eps: list[_Episode], generate: GenerateFn, k: int, rng: random.Random) -> None:
        while active := [ep for ep in eps if not ep.done]:
            cands = generate("verifier", [self._prompt("verifier", ep) for ep in active], k)
            route: dict[str, list[_Episode]] = {"searcher": [], "answerer": []}
            for ep, comps in zip(active, cands):
                says = [parse_verify(c.text) for c in comps]
                recs = []
                for c, yes in zip(comps, says):
                    role = self._verify_role(ep, bool(yes))
                    s = self._record(ep, "verifier", c, yes is not None, role)
                    self._score(s, role, None)
                    recs.append(s)
                ep.samples.extend(recs)
                best = pick_best([s.reward for s in recs], self.tie_break, rng)
                route[self._next_agent(ep, bool(says[best]))].append(ep)

            cands = generate("answerer", [self._prompt("answerer", ep) for ep in route["answerer"]], k)
            for ep, comps in zip(route["answerer"], cands):
                answers = [parse_answer(c.text) for c in comps]
                recs = []
                for c, a in zip(comps, answers):
                    em = float(a is not None and exact_match(a, ep.task.answers))
                    s = self._record(ep, "answerer", c, a is not None, em)
                    self._score(s, em, em)
                    recs.append(s)
                ep.samples.extend(recs)
                ep.answer, ep.done = answers[pick_best([s.reward for s in recs], self.tie_break, rng)], True

            searchers = route["searcher"]
            cands = generate("searcher", [self._prompt("searcher", ep) for ep in searchers], k)
            queries = [[parse_search(c.text) for c in comps] for comps in cands]
            results = iter(self._search([q for qs in queries for q in qs]))
            for ep, comps, qs in zip(searchers, cands, queries):
                recs, found = [], []
                for c, q in zip(comps, qs):
                    passages = next(results)
                    role = float(contains_answer(" ".join(passages), ep.task.answers))
                    s = self._record(ep, "searcher", c, q is not None, role)
                    self._score(s, role, None)
                    recs.append(s)
                    found.append(passages)
                ep.samples.extend(recs)
                best = pick_best([s.reward for s in recs], self.tie_break, rng)
                if qs[best] is not None:
                    ep.history.append((qs[best], found[best]))
                ep.turn += 1
