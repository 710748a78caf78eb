"""Retrievers and the HTTP protocol, over real sockets on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from drmas.workflows.search.retrieval import (
    RETRIEVERS,
    BM25Retriever,
    DenseRetriever,
    Hit,
    HTTPRetriever,
    RetrievalError,
    Retriever,
    make_retriever,
    register_retriever,
)
from drmas.workflows.search.server import serve

CORPUS = [
    "Paris is the capital and most populous city of France.",
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris.",
    "Mount Everest is Earth's highest mountain above sea level, in the Himalayas.",
    "The Amazon river in South America is the largest river by discharge volume of water.",
    "Photosynthesis is the process by which green plants turn sunlight into chemical energy.",
    "Python is a high-level programming language created by Guido van Rossum.",
    "The Great Wall of China was built over centuries to protect against invasions.",
    "Albert Einstein developed the theory of relativity.",
]


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever(CORPUS)


@pytest.fixture(scope="module")
def bm25_url(bm25: BM25Retriever) -> Iterator[str]:
    server, url = serve(bm25)
    yield url
    server.shutdown()
    server.server_close()


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# --- a scripted server: real socket, answers chosen per request, counts requests -------------


class ScriptedServer:
    """Answers request i with script(i) -> (status, body dict); records how many came in."""

    def __init__(self, script: Callable[[int], tuple[int, dict]],
                 delay: Callable[[int], float] = lambda i: 0.0):
        self.count = 0
        self.times: list[float] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    i = outer.count
                    outer.count += 1
                    outer.times.append(time.monotonic())
                time.sleep(delay(i))
                status, obj = script(i)
                body = json.dumps(obj).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout test)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/retrieve"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


OK_BODY = {"result": [[{"document": {"contents": "ok passage"}, "score": 2.5}]]}


@pytest.fixture
def scripted() -> Iterator[Callable[..., ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(script: Callable[[int], tuple[int, dict]], **kw: object) -> ScriptedServer:
        servers.append(ScriptedServer(script, **kw))  # type: ignore[arg-type]
        return servers[-1]

    yield start
    for s in servers:
        s.close()


# --- BM25 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What is the capital of France?", 0),
        ("highest mountain in the Himalayas", 2),
        ("who created the Python programming language", 5),
        ("theory of relativity", 7),
    ],
)
def test_bm25_ranks_the_matching_passage_first(bm25: BM25Retriever, query: str, expected: int) -> None:
    (hits,) = bm25.search([query], topk=3)
    assert hits[0].text == CORPUS[expected]
    assert hits[0].score > hits[1].score


def test_bm25_respects_topk_and_orders_scores(bm25: BM25Retriever) -> None:
    results = bm25.search(["Paris tower", "river water", "plants sunlight energy"], topk=2)
    assert [len(r) for r in results] == [2, 2, 2]
    assert results[0][0].text == CORPUS[1]  # both words
    assert results[0][1].text == CORPUS[0]  # only Paris
    assert results[1][0].text == CORPUS[3]
    assert results[2][0].text == CORPUS[4]
    for hits in results:
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert all(isinstance(h, Hit) and isinstance(h.score, float) for h in hits)


def test_bm25_topk_larger_than_corpus_and_unknown_words(bm25: BM25Retriever) -> None:
    (hits,) = bm25.search(["Einstein"], topk=100)
    assert len(hits) == len(CORPUS)
    assert hits[0].text == CORPUS[7]
    (nothing,) = bm25.search(["zzzqqq xyzzy"], topk=2)  # no word in the index: all scores 0
    assert [h.score for h in nothing] == [0.0, 0.0]
    assert bm25.search([], topk=3) == []


def test_bm25_rejects_bad_arguments(bm25: BM25Retriever) -> None:
    with pytest.raises(ValueError, match="corpus is empty"):
        BM25Retriever([])
    with pytest.raises(ValueError, match="topk must be a positive int"):
        bm25.search(["Paris"], topk=0)
    with pytest.raises(TypeError, match="list of strings"):
        bm25.search("Paris", topk=1)  # type: ignore[arg-type]


# --- dense ----------------------------------------------------------------------------------


def test_dense_finds_a_paraphrase_with_no_shared_words() -> None:
    corpus = [
        "The feline was napping on the rug.",
        "Stock markets fell sharply after the announcement.",
        "He cooked pasta with tomato sauce for dinner.",
        "The spacecraft landed on the surface of Mars.",
    ]
    dense = DenseRetriever(corpus, batch_size=2)  # two batches: padding across batches
    results = dense.search(["a cat sleeping on a carpet", "an evening meal of spaghetti"], topk=4)
    assert results[0][0].text == corpus[0]
    assert results[1][0].text == corpus[2]
    for hits in results:
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert -1.0 - 1e-5 <= scores[-1] and scores[0] <= 1.0 + 1e-5  # cosine similarities
    # an exact copy of a passage is its own best match with cosine ~1
    (self_hit,) = dense.search([corpus[3]], topk=1)
    assert self_hit[0].text == corpus[3]
    assert self_hit[0].score == pytest.approx(1.0, abs=1e-4)


# --- HTTP client against our server ---------------------------------------------------------


def test_http_client_matches_in_process_retriever(bm25: BM25Retriever, bm25_url: str) -> None:
    queries = ["capital of France", "Eiffel Tower Paris", "Great Wall invasions", "nothing matches xyzzy"]
    remote = HTTPRetriever(bm25_url, timeout_s=5, retries=0).search(queries, topk=3)
    local = bm25.search(queries, topk=3)
    assert remote == local
    assert bm25_url.startswith("http://127.0.0.1:") and bm25_url.endswith("/retrieve")


def test_server_speaks_the_search_r1_format(bm25: BM25Retriever, bm25_url: str) -> None:
    status, data = _post(bm25_url,
                         json.dumps({"queries": ["Everest"], "topk": 1, "return_scores": True}).encode())
    (expected,) = bm25.search(["Everest"], topk=1)[0]
    assert status == 200
    assert data == {"result": [[{"document": {"contents": CORPUS[2]}, "score": expected.score}]]}
    # without return_scores the hits are bare documents; `query` is an alias, a string allowed
    status, data = _post(bm25_url, json.dumps({"query": "Everest", "topk": 2}).encode())
    assert status == 200
    assert data["result"][0][0] == {"contents": CORPUS[2]}
    assert len(data["result"][0]) == 2
    # the client reads score-less documents too
    (row,) = make_retriever("http", url=bm25_url).search(["Everest"], topk=1)
    assert row[0].text == CORPUS[2]


def test_server_answers_400_to_bad_requests(bm25_url: str) -> None:
    status, data = _post(bm25_url, b"{not json")
    assert status == 400
    assert "not valid JSON" in data["error"]
    status, data = _post(bm25_url, json.dumps({"topk": 3}).encode())
    assert status == 400
    assert "'queries'" in data["error"]
    status, data = _post(bm25_url, json.dumps({"queries": ["a"], "topk": 0}).encode())
    assert status == 400
    assert "topk" in data["error"]


def test_client_does_not_retry_4xx(bm25_url: str, scripted: Callable[..., ScriptedServer]) -> None:
    srv = scripted(lambda i: (400, {"error": "bad topk"}))
    client = HTTPRetriever(srv.url, timeout_s=5, retries=3, backoff_s=0.01)
    with pytest.raises(RetrievalError, match="HTTP 400: bad topk") as exc:
        client.search(["q"], topk=1)
    assert srv.count == 1
    assert srv.url in str(exc.value)
    # our own server's 404 for a wrong path is a 4xx too
    wrong = bm25_url.replace("/retrieve", "/search")
    with pytest.raises(RetrievalError, match="HTTP 404"):
        HTTPRetriever(wrong, retries=3, backoff_s=0.01).search(["q"], topk=1)


def test_client_retries_5xx_with_backoff_then_fails(scripted: Callable[..., ScriptedServer]) -> None:
    srv = scripted(lambda i: (503, {"error": "index loading"}))
    client = HTTPRetriever(srv.url, timeout_s=5, retries=3, backoff_s=0.02)
    with pytest.raises(RetrievalError) as exc:
        client.search(["q"], topk=1)
    assert srv.count == 4  # one try + 3 retries
    msg = str(exc.value)
    assert srv.url in msg and "4 attempts" in msg and "HTTP 503: index loading" in msg
    gaps = [b - a for a, b in zip(srv.times, srv.times[1:])]
    assert [g >= w for g, w in zip(gaps, [0.02, 0.04, 0.08])] == [True, True, True]


def test_client_recovers_after_one_500(scripted: Callable[..., ScriptedServer]) -> None:
    srv = scripted(lambda i: (500, {"error": "boom"}) if i == 0 else (200, OK_BODY))
    (hits,) = HTTPRetriever(srv.url, retries=2, backoff_s=0.01).search(["q"], topk=1)
    assert hits == [Hit("ok passage", 2.5)]
    assert srv.count == 2


def test_client_retries_after_a_timeout(scripted: Callable[..., ScriptedServer]) -> None:
    srv = scripted(lambda i: (200, OK_BODY), delay=lambda i: 1.0 if i == 0 else 0.0)
    (hits,) = HTTPRetriever(srv.url, timeout_s=0.2, retries=1, backoff_s=0.01).search(["q"], topk=1)
    assert hits == [Hit("ok passage", 2.5)]
    assert srv.count == 2


def test_client_against_a_closed_port_fails_after_retries() -> None:
    with socket.socket() as s:  # a port that nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/retrieve"
    t0 = time.monotonic()
    with pytest.raises(RetrievalError) as exc:
        HTTPRetriever(url, timeout_s=1, retries=2, backoff_s=0.05).search(["q"], topk=1)
    elapsed = time.monotonic() - t0
    assert url in str(exc.value) and "3 attempts" in str(exc.value)
    assert "Connection" in str(exc.value)  # ConnectionRefusedError names the last error
    assert elapsed >= 0.05 + 0.1  # both backoff sleeps happened


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"oops": []}, "'result'"),
        ({"result": [[{"document": {"title": "x"}, "score": 1}]]}, "contents"),
        ({"result": [[{"document": {"contents": "x"}, "score": "high"}]]}, "not a number"),
        ({"result": [[], []]}, "list of 1 lists"),
    ],
)
def test_malformed_responses_are_retrieval_errors(
    scripted: Callable[..., ScriptedServer], body: dict, why: str
) -> None:
    srv = scripted(lambda i: (200, body))
    with pytest.raises(RetrievalError, match="malformed response") as exc:
        HTTPRetriever(srv.url, retries=3, backoff_s=0.01).search(["q"], topk=1)
    assert why in str(exc.value)
    assert srv.count == 1


# --- registry and CLI -----------------------------------------------------------------------


def test_make_retriever_by_name_and_unknown_names() -> None:
    assert {"bm25", "dense", "http"} <= set(RETRIEVERS)
    r = make_retriever("bm25", CORPUS)
    assert isinstance(r, BM25Retriever)
    assert r.search(["Einstein"], 1)[0][0].text == CORPUS[7]
    with pytest.raises(ValueError, match=r"unknown retriever 'nope'; known retrievers: bm25, dense, http"):
        make_retriever("nope", CORPUS)
    with pytest.raises(ValueError, match="needs|indexes a local corpus"):
        make_retriever("bm25")
    with pytest.raises(ValueError, match="does not take a corpus"):
        make_retriever("http", CORPUS, url="http://127.0.0.1:1/retrieve")


def test_register_retriever_adds_a_searchable_class() -> None:
    @register_retriever("echo-test")
    class Echo(Retriever):
        def __init__(self, corpus: list[str]) -> None:
            self.corpus = corpus

        def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
            return [[Hit(q.upper(), 1.0)] for q in queries]

    try:
        assert make_retriever("echo-test", ["x"]).search(["hi"], 1) == [[Hit("HI", 1.0)]]
        server, url = serve(RETRIEVERS.get("echo-test")(["x"]))
        try:
            assert HTTPRetriever(url).search(["hi", "yo"], 1) == [[Hit("HI", 1.0)], [Hit("YO", 1.0)]]
        finally:
            server.shutdown()
            server.server_close()
    finally:
        RETRIEVERS.unregister("echo-test")


def test_cli_serves_a_jsonl_corpus(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": t}) + "\n" for i, t in enumerate(CORPUS)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "drmas.workflows.search.server", "--corpus", str(path), "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the socket is bound
        assert f"serving {len(CORPUS)} passages (bm25) at http://127.0.0.1:{port}/retrieve" in line
        client = HTTPRetriever(f"http://127.0.0.1:{port}/retrieve", timeout_s=5, retries=0)
        assert client.search(["Everest"], 1)[0][0].text == CORPUS[2]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
