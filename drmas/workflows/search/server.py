"""A small Search-R1-compatible retrieval server over any :class:`Retriever`.

It lets rollout workers in other processes share one index, and gives the HTTP client a real
socket to be tested against. Protocol: ``POST /retrieve`` with
``{"queries": [...], "topk": k, "return_scores": bool}`` (``query``, a string or a list, is
accepted too); answer ``{"result": [[{"document": {"contents": ...}, "score": s}, ...], ...]}``,
or lists of bare documents when ``return_scores`` is false.

    python -m drmas.workflows.search.server --corpus corpus.jsonl --port 8000 --retriever bm25
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from drmas.workflows.search.data import load_corpus
from drmas.workflows.search.retrieval import RETRIEVERS, Retriever, make_retriever

__all__ = ["serve", "make_server", "DEFAULT_TOPK", "MAX_BODY_BYTES"]

DEFAULT_TOPK = 3
MAX_BODY_BYTES = 16 * 1024 * 1024


class _BadRequest(ValueError):
    pass


def _parse_request(raw: bytes) -> tuple[list[str], int, bool]:
    try:
        req = json.loads(raw)
    except ValueError as e:
        raise _BadRequest(f"body is not valid JSON: {e}") from e
    if not isinstance(req, dict):
        raise _BadRequest("body must be a JSON object")
    queries = req.get("queries", req.get("query"))
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise _BadRequest("'queries' (or 'query') must be a string or a list of strings")
    topk = req.get("topk", DEFAULT_TOPK)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise _BadRequest(f"'topk' must be a positive integer, got {topk!r}")
    return queries, topk, bool(req.get("return_scores", False))


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A bound, not yet running server; ``serve`` runs it in a thread, the CLI in the foreground."""
    # Handler threads share one retriever; a lock keeps libraries that are not thread-safe
    # (tokenizers, torch modules) safe without each retriever having to care.
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, code: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self.close_connection = True  # the unread body would poison a kept-alive connection
                self._send(400, {"error": f"Content-Length must be 0..{MAX_BODY_BYTES}"})
                return
            raw = self.rfile.read(length)
            if self.path.split("?", 1)[0].rstrip("/") != "/retrieve":
                self._send(404, {"error": f"unknown path {self.path!r}; POST /retrieve"})
                return
            try:
                queries, topk, with_scores = _parse_request(raw)
            except _BadRequest as e:
                self._send(400, {"error": str(e)})
                return
            try:
                with lock:
                    hits = retriever.search(queries, topk)
            except Exception as e:  # noqa: BLE001 - report to the client, keep serving
                self._send(500, {"error": f"{type(e).__name__}: {e}"})
                return
            if with_scores:
                result = [[{"document": {"contents": h.text}, "score": h.score} for h in row] for row in hits]
            else:
                result = [[{"contents": h.text} for h in row] for row in hits]
            self._send(200, {"result": result})

        def do_GET(self) -> None:  # noqa: N802
            self._send(405, {"error": "use POST /retrieve with a JSON body"})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # one line per request would drown rollout logs

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Start a server in a daemon thread; ``port=0`` picks a free port. Returns (server, url).

    Stop it with ``server.shutdown(); server.server_close()``.
    """
    server = make_server(retriever, host, port)
    real_host, real_port = server.server_address[:2]
    threading.Thread(target=server.serve_forever, name="drmas-retrieval-server", daemon=True).start()
    return server, f"http://{real_host}:{real_port}/retrieve"


def main(argv: list[str] | None = None) -> None:
    local = sorted(name for name, cls in RETRIEVERS.items() if cls.needs_corpus)
    p = argparse.ArgumentParser(description="Serve a corpus over the Search-R1 retrieval API "
                                            "(POST /retrieve).")
    p.add_argument("--corpus", required=True, help="JSONL file, one passage per line in 'contents' or 'text'")
    p.add_argument("--retriever", default="bm25", choices=local)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)

    corpus = load_corpus(args.corpus)
    server = make_server(make_retriever(args.retriever, corpus), args.host, args.port)
    host, port = server.server_address[:2]
    print(f"serving {len(corpus)} passages ({args.retriever}) at http://{host}:{port}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
