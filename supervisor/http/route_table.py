"""The HTTP door's routes, in one table checked against :mod:`supervisor.apispec`.

Every route the door serves is a :class:`Route` of :data:`ROUTES`: its HTTP method and path,
what it does (``GET /v1`` lists them), the module that serves it (``native``:
:mod:`.routes`, whose handler has the route's ``handler`` name; ``openai``, ``ollama``: those
modules add their own), and ``api``: the method of :data:`supervisor.apispec.METHODS` it
carries, if any.  The API's methods that the door does not carry are listed in
:data:`NOT_ON_HTTP`, each with the reason.

:func:`check` holds the two against the spec: every listed method is carried by exactly one
route or named in :data:`NOT_ON_HTTP`, never both; a method that changes the engine is a
``POST`` (so the guard asks for the token, :mod:`.auth`), one that only reads is a ``GET``.
It runs when the routes are added, so an API method added without its HTTP route fails every
HTTP server's start, as a control server's handler does (:func:`supervisor.control.methods.
handler_names`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Route:
    method: str  # GET or POST (DELETE for another API's route)
    path: str  # as aiohttp takes it ({name} for a part; {name:regex} to constrain it)
    what: str
    api: str | None = None  # the apispec method it carries
    handler: str = ""  # native routes: the handler's name on routes._Routes
    module: str = "native"  # or "openai", "ollama", "llama-swap": added by those modules


def _n(method: str, path: str, handler: str, what: str, api: str | None = None) -> Route:
    return Route(method, path, what, api, handler)


ROUTES: tuple[Route, ...] = (
    _n("GET", "/v1", "index", "this list"),
    # -- jobs
    _n("POST", "/v1/jobs", "submit", "submit a job: waits; Prefer: respond-async -> 202; "
       "Accept: text/event-stream -> SSE", "submit"),
    _n("GET", "/v1/jobs", "jobs", "jobs (?state=&backend=&limit=)", "jobs"),
    _n("POST", "/v1/jobs/cancel", "cancel_many", "cancel several jobs {\"jobs\": [ids]}",
       "cancel_many"),
    _n("GET", "/v1/jobs/{id}", "job", "a job: state, queue position, why it waits", "job"),
    _n("GET", "/v1/jobs/{id}/result", "result", "a finished job's result, as the worker "
       "answered"),
    _n("GET", "/v1/jobs/{id}/wait", "wait", "the job once it has ended (?timeout=: 504 "
       "after it; the job goes on)", "wait"),
    _n("GET", "/v1/jobs/{id}/events", "job_events", "a job's events (SSE)"),
    _n("GET", "/v1/jobs/{id}/request", "job_request", "the request it was submitted with "
       "(?limit=), while kept", "job_request"),
    _n("POST", "/v1/jobs/{id}/cancel", "cancel", "cancel a job", "cancel"),
    _n("POST", "/v1/jobs/{id}/retry", "retry", "run a finished job's request again: the new "
       "job, 202", "retry"),
    _n("POST", "/v1/jobs/{id}/priority", "set_priority", "a queued job's new priority "
       "{\"priority\": n}", "set_priority"),
    # -- backends
    _n("GET", "/v1/backends", "backends", "backends: state, memory, keep-alive, peaks"),
    _n("POST", "/v1/backends/unload", "unload_all", "unload every idle backend", "zero"),
    _n("POST", "/v1/backends/reload", "reload", "read the backend descriptors again",
       "reload"),
    _n("GET", "/v1/backends/{b}", "backend", "one backend"),
    _n("POST", "/v1/backends/{b}/load", "load", "start its worker now", "preload"),
    _n("POST", "/v1/backends/{b}/unload", "unload", "stop its idle worker", "evict"),
    _n("POST", "/v1/backends/{b}/respawn", "respawn", "restart its worker", "respawn"),
    _n("POST", "/v1/backends/{b}/kill", "kill", "SIGKILL its (stuck) worker; its jobs fail",
       "kill"),
    _n("POST", "/v1/backends/{b}/sleep", "sleep", "put its idle worker to sleep (memory "
       "given back, process kept)", "sleep"),
    _n("POST", "/v1/backends/{b}/wake", "wake", "wake its sleeping worker", "wake"),
    _n("GET", "/v1/backends/{b}/logs", "logs", "its worker's log (?lines=&follow=1)", "logs"),
    _n("GET", "/v1/backends/{b}/descriptor", "descriptor", "its descriptor: each file's "
       "entry, and what runs now", "descriptor"),
    _n("GET", "/v1/backends/{b}/calibration", "calibration_report", "its latest calibration "
       "report (?name=)", "calibration_report"),
    _n("POST", "/v1/backends/{b}/calibrate", "calibrate", "queue a calibration run "
       "{repeats, settle_s, input | input_b64}: the job, 202", "calibrate"),
    # -- GPUs, the engine
    _n("GET", "/v1/gpus", "gpus", "GPUs and their memory"),
    _n("POST", "/v1/gpus/{gpu}/drain", "drain", "drain a GPU, or open it again "
       "{\"on\": false}", "drain"),
    _n("POST", "/v1/gpus/{gpu}/yield", "yield_gpu", "hand a GPU over to programs we do not "
       "manage {\"for\": \"1h\", \"now\": false, \"by\": \"...\"}", "yield_gpus"),
    _n("POST", "/v1/gpus/{gpu}/resume", "resume_gpu", "take a yielded GPU back",
       "resume_gpus"),
    _n("GET", "/v1/snapshot", "snapshot", "the whole engine at this instant (?light=1)",
       "snapshot"),
    _n("GET", "/v1/events", "events", "every engine event (SSE)", "subscribe"),
    _n("GET", "/v1/stats", "stats", "this HTTP server's counters and connections", "stats"),
    _n("GET", "/healthz", "healthz", "alive", "ping"),
    _n("GET", "/readyz", "readyz", "ready for jobs (503 while stopping)"),
    _n("GET", "/v1/version", "version", "versions"),
    _n("GET", "/metrics", "metrics", "Prometheus metrics"),
    # -- other APIs' shapes
    Route("GET", "/v1/models", "OpenAI: the backends that declare an api", module="openai"),
    Route("GET", "/v1/models/{model:.+}", "OpenAI: one model", module="openai"),
    Route("POST", "/v1/chat/completions", "OpenAI chat (stream: true for SSE)",
          module="openai"),
    Route("POST", "/v1/completions", "OpenAI completions", module="openai"),
    Route("POST", "/v1/embeddings", "OpenAI embeddings", module="openai"),
    Route("POST", "/v1/images/generations", "OpenAI images", module="openai"),
    Route("POST", "/v1/audio/speech", "OpenAI text to speech", module="openai"),
    Route("POST", "/v1/audio/transcriptions", "OpenAI speech to text (multipart)",
          module="openai"),
    Route("POST", "/v1/responses", "OpenAI responses (backends that list it)",
          module="openai"),
    Route("POST", "/v1/rerank", "rerank (backends that list it)", module="openai"),
    Route("*", "/upstream/{model}/{path:.*}", "any request to a model server (websockets "
          "too), loading it first", module="openai"),
    Route("*", "/upstream/{model}", "a redirect to /upstream/{model}/ (301; 308 but for a "
          "GET)", module="openai"),
    Route("GET", "/api/ps", "Ollama: loaded models", module="ollama"),
    Route("GET", "/", "Ollama: 'Ollama is running' (its CLI asks it first)", module="ollama"),
    Route("GET", "/api/version", "Ollama: version", module="ollama"),
    Route("GET", "/api/tags", "Ollama: models", module="ollama"),
    Route("POST", "/api/show", "Ollama: one model", module="ollama"),
    Route("POST", "/api/chat", "Ollama chat (NDJSON stream unless stream: false)",
          module="ollama"),
    Route("POST", "/api/generate", "Ollama generate (NDJSON stream unless stream: false)",
          module="ollama"),
    Route("POST", "/api/embed", "Ollama embeddings", module="ollama"),
    Route("POST", "/api/embeddings", "Ollama embeddings (the legacy route)", module="ollama"),
    Route("POST", "/api/pull", "Ollama: not supported (vramtui downloads no models)",
          module="ollama"),
    Route("POST", "/api/push", "Ollama: not supported", module="ollama"),
    Route("POST", "/api/create", "Ollama: not supported", module="ollama"),
    Route("POST", "/api/copy", "Ollama: not supported", module="ollama"),
    Route("DELETE", "/api/delete", "Ollama: not supported", module="ollama"),
    Route("GET", "/health", "llama-swap: OK", module="llama-swap"),
    Route("GET", "/running", "llama-swap: the models whose process is up", module="llama-swap"),
    Route("GET", "/unload", "llama-swap: unload every idle model (guarded as a POST)",
          module="llama-swap"),
    Route("POST", "/api/models/unload", "llama-swap: unload every idle model",
          module="llama-swap"),
    Route("POST", "/api/models/unload/{model:.+}", "llama-swap: unload one model",
          module="llama-swap"),
    Route("GET", "/logs", "llama-swap: the recent event log (text)", module="llama-swap"),
    Route("GET", "/log", "llama-swap: the recent event log (text)", module="llama-swap"),
    Route("GET", "/logs/stream", "llama-swap: the engine's log, followed (?no-history: "
          "without its recent lines)", module="llama-swap"),
    Route("GET", "/logs/stream/proxy", "llama-swap: the same (its proxy's log)",
          module="llama-swap"),
    Route("GET", "/logs/stream/{model:.+}", "llama-swap: a model's log, followed (a "
          "redirect)", module="llama-swap"),
)

NOT_ON_HTTP: dict[str, str] = {
    "stop": "local: an embedded caller stops its own engine (a client closes itself)",
    "shutdown": "stopping the engine is local: the control socket (uid-checked) and "
                "SIGTERM; the HTTP door may face other machines",
    "unsubscribe": "an SSE stream ends when its client closes it",
}


def api_routes(routes: tuple[Route, ...] = ROUTES) -> dict[str, Route]:
    """API method -> the route that carries it."""
    return {r.api: r for r in routes if r.api is not None}


def check(methods: Mapping[str, Any], routes: tuple[Route, ...] = ROUTES,
          not_on_http: Mapping[str, str] = NOT_ON_HTTP) -> None:
    """Raise ``TypeError`` unless ``routes`` carry every method of ``methods`` (the spec's
    :data:`~supervisor.apispec.METHODS`) that ``not_on_http`` does not name, each once, with
    the HTTP method its kind asks for."""
    problems = []
    carried: dict[str, Route] = {}
    seen: set[tuple[str, str]] = set()
    for r in routes:
        if (r.method, r.path) in seen:
            problems.append(f"{r.method} {r.path} is in the table twice")
        seen.add((r.method, r.path))
        if r.api is None:
            continue
        if r.api in carried:
            problems.append(f"{r.api} is carried by two routes: {carried[r.api].path} and "
                            f"{r.path}")
        carried[r.api] = r
        if r.api not in methods:
            problems.append(f"{r.method} {r.path} carries {r.api!r}, which the API does not "
                            "list")
            continue
        m = methods[r.api]
        want = "POST" if m.mutating else "GET"
        if r.method != want:
            problems.append(f"{r.api} changes the engine: it must be a POST" if m.mutating
                            else f"{r.api} only reads: it must be a GET")
    for name in methods:
        if name in carried and name in not_on_http:
            problems.append(f"{name} is both on HTTP ({carried[name].path}) and listed as "
                            "not on it")
        elif name not in carried and name not in not_on_http:
            problems.append(f"the API lists {name!r} but the HTTP door neither carries it "
                            "nor says why not (supervisor/http/route_table.py)")
    for name in not_on_http:
        if name not in methods:
            problems.append(f"NOT_ON_HTTP names {name!r}, which the API does not list")
    if problems:
        raise TypeError("; ".join(problems))
