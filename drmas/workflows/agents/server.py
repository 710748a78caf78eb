"""The HTTP side of the endpoint: an OpenAI-compatible API on the loopback interface, served by
uvicorn (FastAPI) in a thread of its own, one base URL and one API key per episode, and one per
worker process that follows the episode the worker plays now (for clients a program builds once).

The server never generates: a checked request becomes a :class:`Call` in the inbox, and the
thread that plays the rollout answers it (:mod:`drmas.workflows.agents.dispatch`), because generation
must run where ``rollout()`` was called (the HF engine is the training model, vLLM's ``LLM`` is
not thread-safe, a SIGTERM must end the rollout there). A completion becomes a sample only once
it is delivered: a client that disconnected while it waited leaves nothing behind.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations as objects
import asyncio
import json
import queue
import secrets
import socket
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from drmas.workflows.agents.protocol import (ApiError, ChatRequest, Reply, chat_chunks, chat_response,
                                        parse_chat_request)
from drmas.workflows.agents.responses import chat_body, response_events, response_object
from drmas.records import Completion, GenerationSettings

__all__ = ["MAX_BODY_BYTES", "Call", "Endpoint", "Session", "WorkerSlot"]

MAX_BODY_BYTES = 16 * 2**20
"""The largest request body taken (uvicorn sets none): a longer one is a 413, read no further."""


@dataclass
class Record:
    """One delivered completion: the agent, its turn (the agent's k-th call), the completion,
    whether it began a tool call the parser did not take (then the sample is invalid), and whether
    its length was capped by the program below the policy's limit (reaching it is no fault)."""

    agent: str
    turn: int
    completion: Completion
    malformed: bool = False
    own_cap: bool = False
    response_id: str = ""
    """The id the client saw (an episode may reward this call by it)."""
    call: int = 0
    """Its place among the episode's calls, every agent's together (the episode records' order)."""
    messages: tuple[tuple[str, str], ...] = ()
    """The request's messages as (role, content)."""
    fields: tuple[str, ...] = ()
    """Per message, its OpenAI fields beyond role and content as JSON text (``ChatPrompt.fields``)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """The tool calls parsed out of the answer, as the client was shown them."""


@dataclass
class Session:
    """One episode's view of the endpoint: its URL id, what it may ask, what it was given."""

    id: str
    index: int
    """The episode's position in the rollout (calls are served in this order)."""
    agents: tuple[str, ...]
    settings: dict[str, GenerationSettings] | None
    training: bool
    contexts: dict[str, int | None] = field(default_factory=dict)
    """Each agent's context length (prompt plus response tokens; absent or None: not known)."""
    key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    """The episode's own API key: a request with another key gets 401."""
    records: list[Record] = field(default_factory=list)
    open: bool = True
    calls: int = 0
    overrides: int = 0
    """Requests that asked for sampling other than the policy's."""
    _turns: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, req: ChatRequest, replies: Sequence[Reply]) -> bool:
        """Keep delivered completions as samples (False: the session closed meanwhile)."""
        agent = req.agent
        with self._lock:
            if not self.open:
                return False
            for r in replies:
                turn = self._turns.get(agent, 0)
                self._turns[agent] = turn + 1
                self.records.append(Record(agent, turn, r.completion, r.malformed > 0, req.own_cap, r.id,
                                           len(self.records), req.prompt.messages, req.prompt.fields,
                                           r.tool_calls))
            return True

    def close(self) -> None:
        with self._lock:
            self.open = False


@dataclass
class WorkerSlot:
    """A worker process's own address: its key, and the episode it plays now (None between two)."""

    key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    session: Session | None = None


@dataclass
class Call:
    """A checked request waiting for the dispatcher, and how to answer it."""

    session: Session
    request: ChatRequest
    seq: int
    answer: Callable[[Any], None]
    """Thread-safe: a list of :class:`Reply`, or an :class:`ApiError`."""


def _reachable(host: str) -> str:
    """The address to hand programs for a server bound to ``host``: itself, or for every interface
    (``0.0.0.0``, ``::``) this machine's name as it resolves (loopback where nothing else does)."""
    if host not in ("0.0.0.0", "::", ""):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


async def _body(request: Any) -> Any:
    """The request's JSON body, read up to :data:`MAX_BODY_BYTES` (413 beyond it, 400 when not JSON)."""
    too_long = ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", "body_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_long
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            raise too_long
    try:
        return json.loads(data)
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON", "invalid_json") from None


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


class Endpoint:
    """The server: start once, open a session per episode, close it when the episode ends (its
    URL answers 410 from then on)."""

    def __init__(self, agents: Sequence[str], host: str = "127.0.0.1",
                 advertise_host: str | None = None) -> None:
        self.agents, self.bind = tuple(agents), host
        self.host = advertise_host or _reachable(host)
        """The host in the URLs programs are given (the bound one, or this machine's address)."""
        self.inbox: queue.Queue = queue.Queue()
        self.sessions: dict[str, Session] = {}
        self.gone: dict[str, str] = {}
        """Ended episodes' ids and keys: their URLs answer 410."""
        self.workers: dict[str, WorkerSlot] = {}
        self.late_calls = 0
        """Requests that came after their episode ended (answered 410), since the start."""
        self.unknown_agents = 0
        """Requests whose ``model`` is not an agent (answered 404), since the start."""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # ---- lifetime ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.bind, 0))
        self.port = sock.getsockname()[1]
        self.bound = sock.getsockname()[0]
        config = uvicorn.Config(self._app(), log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=60)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="drmas-endpoint")
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the drmas endpoint's HTTP server did not start")
            self._thread.join(0.01)

    def close(self) -> None:
        if self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(10)
        self._thread = self._server = None

    def open_session(self, sid: str, index: int, settings: dict[str, GenerationSettings] | None,
                     training: bool, contexts: dict[str, int | None] | None = None) -> Session:
        session = Session(sid, index, self.agents, settings, training, dict(contexts or {}))
        self.sessions[sid] = session
        return session

    def end_session(self, session: Session) -> None:
        session.close()
        self.gone[session.id] = session.key
        self.sessions.pop(session.id, None)

    def base_url(self, session: Session) -> str:
        return f"http://{self.host}:{self.port}/episodes/{session.id}/v1"

    def add_worker(self, wid: str) -> tuple[str, str]:
        """A worker's own base URL and key: requests there reach the episode it plays now."""
        slot = self.workers.setdefault(wid, WorkerSlot())
        return f"http://{self.host}:{self.port}/workers/{wid}/v1", slot.key

    def assign(self, wid: str, session: Session | None) -> None:
        """The episode worker ``wid`` plays from now on (None: none, until its next one)."""
        if wid in self.workers:
            self.workers[wid].session = session

    def _late(self, message: str) -> ApiError:
        self.late_calls += 1
        return ApiError(410, message, "episode_gone")

    # ---- the app ----------------------------------------------------------------------------

    def _session(self, sid: "str | None", authorization: "str | None") -> "Session | None":
        """The URL's episode, if the key is its own (``sid`` None: any open episode's or worker's key
        will do)."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip().encode() if scheme.lower() == "bearer" else b""
        session = None if sid is None else self.sessions.get(sid)
        known = session is not None or sid in self.gone
        keys = ([session.key if session is not None else self.gone[sid]] if known
                else [s.key for s in list(self.sessions.values())]
                + [w.key for w in list(self.workers.values())])
        if not token or not any(secrets.compare_digest(token, k.encode()) for k in keys):
            raise ApiError(401, "missing or wrong API key: use the api_key the episode was given (each "
                           "episode has its own, for its own URL)", "invalid_api_key")
        if sid is None:
            return None
        if not known:
            raise ApiError(404, f"no episode {sid!r} on this endpoint", "episode_not_found")
        if session is None or not session.open:
            raise self._late(f"episode {sid!r} has ended (finished, failed or timed out); its URL takes no "
                             "more requests (a client kept from an earlier episode, or a thread the program "
                             "left running? use the client episode() is given, or one built from the "
                             "environment, which follows the worker's episode)")
        return session

    def _worker_session(self, wid: str, authorization: "str | None") -> Session:
        """The episode worker ``wid`` plays now, if the key is the worker's own."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip().encode() if scheme.lower() == "bearer" else b""
        slot = self.workers.get(wid)
        if slot is None or not token or not secrets.compare_digest(token, slot.key.encode()):
            raise ApiError(401, "missing or wrong API key: use the api_key of the worker's environment "
                           "(OPENAI_API_KEY)", "invalid_api_key")
        session = slot.session
        if session is None or not session.open:
            raise self._late(f"no episode plays on worker {wid!r} now: this request came after its "
                             "episode ended (a thread the program left running?)")
        return session

    @staticmethod
    async def _events(session: Session, req: ChatRequest, replies: list[Reply], body: "dict | None") -> Any:
        """Server-sent events of an answer (chat chunks, or the Responses API's events when
        ``body`` is a Responses request); its samples are kept once the last event has been handed
        to the connection (a client gone before that cancels this, and nothing is recorded)."""
        if body is None:
            for chunk in chat_chunks(req.agent, replies, req.include_usage):
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            session.record(req, replies)
            yield "data: [DONE]\n\n"
            return
        *events, last = response_events(req.agent, replies[0], body)
        for event in events:
            yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        session.record(req, replies)
        yield f"event: {last['type']}\ndata: {json.dumps(last, ensure_ascii=False)}\n\n"

    def _app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, Response, StreamingResponse

        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        @app.exception_handler(ApiError)
        async def api_error(request: Request, err: ApiError) -> JSONResponse:
            return JSONResponse(err.body(), status_code=err.status)

        def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": a, "object": "model", "created": 0, "owned_by": "drmas"}
                                               for a in self.agents]}

        @app.get("/v1/models")
        async def all_models(request: Request) -> dict[str, Any]:
            self._session(None, request.headers.get("authorization"))
            return models()

        @app.get("/episodes/{sid}/v1/models")
        async def episode_models(sid: str, request: Request) -> dict[str, Any]:
            self._session(sid, request.headers.get("authorization"))
            return models()

        @app.get("/workers/{wid}/v1/models")
        async def worker_models(wid: str, request: Request) -> dict[str, Any]:
            self._worker_session(wid, request.headers.get("authorization"))
            return models()

        async def answer(session: Session, request: Request, responses: bool) -> Any:
            body = await _body(request)
            chat = chat_body(body) if responses else body
            try:
                req = parse_chat_request(chat, self.agents, session.settings, session.training)
            except ApiError as err:
                self.unknown_agents += err.code == "model_not_found"
                raise
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            with session._lock:
                seq, session.calls = session.calls, session.calls + 1
                session.overrides += int(req.overrides_generation)
            self.inbox.put(Call(session, req, seq,
                                lambda value: loop.call_soon_threadsafe(_settle, future, value)))
            result = await future
            if isinstance(result, ApiError):
                raise result
            rid = f"resp_{uuid.uuid4().hex}" if responses else f"chatcmpl-{uuid.uuid4().hex}"
            for reply in result:  # one id per answer, its choices' too
                reply.id = rid
            if await request.is_disconnected():
                return Response(status_code=499)  # nobody reads it; nothing was recorded
            if req.stream:
                events = self._events(session, req, result, body if responses else None)
                return StreamingResponse(events, media_type="text/event-stream")
            if not session.record(req, result):
                return Response(status_code=499)
            if responses:
                return response_object(req.agent, result[0], body)
            return chat_response(req.agent, result)

        @app.post("/episodes/{sid}/v1/chat/completions")
        async def chat(sid: str, request: Request) -> Any:
            return await answer(self._session(sid, request.headers.get("authorization")), request, False)

        @app.post("/episodes/{sid}/v1/responses")
        async def responses(sid: str, request: Request) -> Any:
            return await answer(self._session(sid, request.headers.get("authorization")), request, True)

        @app.post("/workers/{wid}/v1/chat/completions")
        async def worker_chat(wid: str, request: Request) -> Any:
            session = self._worker_session(wid, request.headers.get("authorization"))
            return await answer(session, request, False)

        @app.post("/workers/{wid}/v1/responses")
        async def worker_responses(wid: str, request: Request) -> Any:
            session = self._worker_session(wid, request.headers.get("authorization"))
            return await answer(session, request, True)

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
        async def other(path: str, request: Request) -> Any:
            self._session(None, request.headers.get("authorization"))
            if path.endswith("v1/completions") and not path.endswith("chat/completions"):
                raise ApiError(400, f"/{path} (the legacy completions API) is not served: use "
                               "/v1/chat/completions or /v1/responses", "unsupported_endpoint")
            raise ApiError(404, f"no route /{path}: the endpoint serves /episodes/<id>/v1/chat/completions "
                           "and /v1/models", "not_found")

        return app
