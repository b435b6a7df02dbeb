"""The one list of the engine API's methods: names, arguments (types, defaults, checks), results.

Everything that speaks the API is derived from or checked against :data:`METHODS`:

- the control server (:mod:`supervisor.control.methods`) validates every request with
  :meth:`Method.from_wire` and answers only the methods listed here;
- the client (:class:`supervisor.client.Client`) builds each request with
  :meth:`Method.to_wire` and rebuilds the reply with :meth:`Method.decode`;
- the in-process facade (:class:`supervisor.facade.Supervisor`) validates with
  :meth:`Method.check`, so embedded and remote callers get the same errors;
- ``tests/test_api_spec.py`` fails when the signature of a method of
  :class:`supervisor.api.EngineAPI`, ``Supervisor`` or ``Client`` drifts from its entry here.

An argument's ``side`` says who sees it: ``api`` (the Python signature and the wire), ``wire``
(the client and the wire only, e.g. ``submit(wait=True)`` behind ``Client.submit_wait``) or
``local`` (the Python signature only, never sent, e.g. a subscription's callback).

Imports only the view dataclasses (a CLI process pays for nothing else).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .control.logtail import MAX_LINES as MAX_LOG_LINES
from .errors import InvalidRequest
from .jobs import JobView
from .jobs.query import DEFAULT_LIMIT, MAX_LISTED_BACKENDS, limit_problem, states_problem
from .snapshot import EngineSnapshot


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


# -- value kinds: each turns a given value into the one the engine takes, or raises ----------


class _Bad(Exception):
    """A value of the wrong kind (the message is what it must be)."""


class Kind:
    """What an argument takes: ``name`` for messages, ``convert`` checks and normalises.

    (This module's classes are plain slotted classes, not dataclasses: the client imports
    the list at every start, and frozen dataclasses cost it milliseconds to build.)"""

    __slots__ = ("convert", "hint", "name")

    def __init__(self, name: str, convert: Callable[[Any], Any], hint: str) -> None:
        self.name, self.convert, self.hint = name, convert, hint  # hint: the annotation

    def __call__(self, value: Any) -> Any:
        return self.convert(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Bad("str")


def _bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise _Bad("bytes")


def _int(value: Any) -> int:
    if _is_int(value):
        return int(value)
    raise _Bad("int")


def _num(value: Any) -> float:
    if _is_int(value) or isinstance(value, float):
        try:
            return float(value)
        except OverflowError:  # an integer past a float's range (JSON may send one):
            return float("inf") if value > 0 else float("-inf")  # refused by its range
    raise _Bad("a number")


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _Bad("bool")


def _map(value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        return dict(value)
    raise _Bad("a map")


def _strs(value: Any) -> tuple[str, ...]:
    if isinstance(value, list | tuple | set | frozenset) and all(isinstance(v, str)
                                                                 for v in value):
        return tuple(value)
    raise _Bad("a list of strings")


def _ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, list | tuple) and all(_is_int(v) and v >= 0 for v in value):
        return tuple(int(v) for v in value)
    raise _Bad("a list of GPU indexes (whole numbers, 0 or more)")


def _any(value: Any) -> Any:
    return value


# The values with an edge rule of their own are checked by supervisor.validate (its owner:
# the engine applies the same checks, so every door refuses them in the same words);
# imported on first use, so a command that sends none of them never loads it.
def _priority(value: Any) -> int | None:
    from .validate import check_priority

    return check_priority(value)


def _timeout(value: Any) -> float | None:
    from .validate import check_seconds

    return check_seconds(value, "timeout")


def _wait_timeout(value: Any) -> float | None:
    from .validate import check_seconds

    return check_seconds(value, "wait timeout", allow_zero=True)


def _metadata(value: Any) -> dict[str, Any]:
    from .validate import check_metadata

    return check_metadata(value)


STR = Kind("str", _str, "str")
BYTES = Kind("bytes", _bytes, "bytes")
INT = Kind("int", _int, "int")
NUM = Kind("number", _num, "float")
BOOL = Kind("bool", _bool, "bool")
MAP = Kind("map", _map, "dict[str, Any]")
STRS = Kind("list of str", _strs, "Sequence[str]")
INTS = Kind("list of int", _ints, "Sequence[int]")
ANY = Kind("any", _any, "Any")  # local arguments only (a callback)
PRIORITY = Kind("priority", _priority, "int")
TIMEOUT = Kind("seconds", _timeout, "float")
WAIT_TIMEOUT = Kind("seconds", _wait_timeout, "float")
METADATA = Kind("metadata", _metadata, "dict[str, Any]")


def _short_name(value: Any) -> str | None:
    if len(value) <= 80 and value.isprintable():
        return None
    return "must be at most 80 printable characters"


def _positive_duration(value: Any) -> str | None:
    from .validate import YIELD_MAX_S  # a yield's (the one duration checked here)

    if 0 < value <= YIELD_MAX_S:
        return None
    return "must be a duration of more than 0 s and at most a year"


def between(low: float, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be between {low:g} and {high:g}"

    return check


def at_least(low: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value >= low else f"must be at least {low:g}"

    return check


def at_most_items(n: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if len(value) <= n else f"takes at most {n} items"

    return check


def _described(value: Any) -> str:
    """What a refused value is, for its message: its type, and for a list what it holds."""
    if isinstance(value, list | tuple):
        held = sorted({type(v).__name__ for v in value})
        return f"a list holding {', '.join(held[:4])}" if held else "an empty list"
    return type(value).__name__


class Arg:
    """One argument of a method.

    ``name``: its Python name; ``positional``: positional-or-keyword in the signature (else
    keyword-only); ``side``: "api" (signature and wire), "wire" (client and wire), "local"
    (no wire); ``wire``: its name on the wire when not ``name``; ``check``: a message when
    the value is refused; ``via``: the Client method that reaches this wire argument.
    """

    __slots__ = ("check", "default", "doc", "kind", "name", "positional", "side", "via",
                 "wire")

    def __init__(self, name: str, kind: Kind, default: Any = REQUIRED, doc: str = "", *,
                 positional: bool = False, side: str = "api", wire: str | None = None,
                 check: Callable[[Any], str | None] | None = None,
                 via: str | None = None) -> None:
        self.name, self.kind, self.default, self.doc = name, kind, default, doc
        self.positional, self.side, self.wire = positional, side, wire
        self.check, self.via = check, via

    def __repr__(self) -> str:
        return f"Arg({self.name!r}, {self.kind.name})"

    @property
    def wire_name(self) -> str:
        return self.wire or self.name

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def take(self, method: str, value: Any) -> Any:
        """``value`` as the engine takes it (None: the default); InvalidRequest if refused."""
        if value is None:
            if self.required:
                raise InvalidRequest(f"{method}: missing argument {self.name!r}")
            return self.default
        try:
            value = self.kind(value)
        except _Bad as exc:
            raise InvalidRequest(f"{method}: argument {self.name!r} must be {exc}, not "
                                 f"{_described(value)}", self.wire_name) from None
        if self.check is not None:
            problem = self.check(value)
            if problem is not None:
                got = f"{len(value)} of them" if isinstance(value, list | tuple) \
                    else f"{value!r:.60}"
                raise InvalidRequest(f"{method}: argument {self.name!r} {problem} (got {got})",
                                     self.wire_name)
        return value


class Method:
    """One method: its arguments in signature order, what it answers, where it lives.

    ``call``: a plain request and reply.  ``deferred``: the reply waits (``wait``).
    ``stream``: a subscription (events follow the reply on that connection).  ``local``: no
    wire method (``stop``).  ``facade``: part of :class:`supervisor.api.EngineAPI`; else the
    wire (and the client) only.  ``client``: the Client's name for it (None: none).
    ``safe``: reads only, so the client may send it again on a fresh connection.
    """

    __slots__ = ("args", "client", "doc", "facade", "how", "mutating", "name", "returns",
                 "safe")

    def __init__(self, name: str, args: tuple[Arg, ...], returns: Any, doc: str, *,
                 how: str = "call", facade: bool = True, client: str | None = "",
                 safe: bool = False, mutating: bool = False) -> None:
        # returns: the Python type of the result (dataclasses are rebuilt from the wire), or
        # a name of supervisor.results ("LogChunk", or "CancelResult..." for a tuple of them)
        self.name, self.args, self.returns, self.doc = name, args, returns, doc
        self.how, self.facade, self.client = how, facade, client
        self.safe, self.mutating = safe, mutating  # mutating: off in a read-only TUI

    def __repr__(self) -> str:
        return f"Method({self.name!r})"

    @property
    def client_name(self) -> str | None:
        return self.name if self.client == "" else self.client

    def arg(self, name: str) -> Arg:
        return next(a for a in self.args if a.name == name)

    def signature_args(self, *, client: bool = False) -> tuple[Arg, ...]:
        """The arguments of the Python signature (the client's also has the wire ones)."""
        sides = ("api", "local", "wire") if client else ("api", "local")
        return tuple(a for a in self.args if a.side in sides and a.via is None)

    def check(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The in-process facade's call, validated: keyword arguments for the engine side
        (``api`` arguments only: the wire's and the local ones are not the engine's)."""
        unknown = set(given) - {a.name for a in self.args}
        if unknown:
            raise InvalidRequest(f"{self.name}: unknown argument(s) {', '.join(sorted(unknown))}")
        return {a.name: a.take(self.name, given.get(a.name)) for a in self.args
                if a.side == "api"}

    def to_wire(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The request's ``a`` map, validated (defaults left out: the server applies them)."""
        out: dict[str, Any] = {}
        for a in self.args:
            if a.side == "local":
                continue
            value = given.get(a.name)
            if value is None:
                if a.required:
                    raise InvalidRequest(f"{self.name}: missing argument {a.name!r}")
                continue
            out[a.wire_name] = a.take(self.name, value)
        return out

    def from_wire(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """A request's ``a`` map as validated keyword arguments (unknown keys ignored, so a
        newer client's extra argument does not break an older engine)."""
        return {a.name: a.take(self.name, given.get(a.wire_name)) for a in self.args
                if a.side != "local"}

    @property
    def result_type(self) -> Any:
        """:attr:`returns`, with a name of :mod:`supervisor.results` resolved (those are
        imported on first use: a ``vramtui status`` never pays for them)."""
        if isinstance(self.returns, str):
            from . import results

            name, many = self.returns.removesuffix("..."), self.returns.endswith("...")
            cls = getattr(results, name)
            return tuple[cls, ...] if many else cls  # type: ignore[valid-type]
        return self.returns

    def decode(self, value: Any) -> Any:
        """A reply's ``r`` rebuilt as :attr:`returns` (raises DecodeError when malformed)."""
        from .control.codec import decoder

        return decoder(self.result_type)(value)


def _m(name: str, returns: Any, doc: str, *args: Arg, **kw: Any) -> Method:
    return Method(name, args, returns, doc, **kw)


_JOB = Arg("job_id", STR, doc="the job's id", positional=True, wire="job")
_BACKEND = Arg("backend", STR, doc="a configured backend's name", positional=True)
_SUBMIT_ARGS = (
    Arg("backend", STR, doc="the backend to run the request on", positional=True),
    Arg("payload", BYTES, b"", "the request's bytes (text is sent as UTF-8)", positional=True),
    Arg("priority", PRIORITY, None, "higher runs first (default: the backend's priority)"),
    Arg("timeout", TIMEOUT, None, "seconds from its dispatch to a worker until the job is "
        "timed out (the queue's wait not counted)"),
    Arg("metadata", METADATA, None, "plain data passed to the worker with the request"),
    Arg("stream", BOOL, False, "collect the result as a stream of chunks"),
)

METHODS: dict[str, Method] = {m.name: m for m in (
    # -- jobs ----------------------------------------------------------------------------------
    _m("submit", str, "Queue a job; its id once the engine accepted it (journaled first).",
       *_SUBMIT_ARGS,
       Arg("wait", BOOL, False, "reply only when the job has ended", side="wire",
           via="submit_wait"),
       Arg("wait_timeout", WAIT_TIMEOUT, None, "with wait: give up waiting after this many "
           "seconds",
           side="wire", via="submit_wait"),
       Arg("follow", BOOL, False, "send the job's events on this connection", side="wire",
           via="submit_follow"),
       mutating=True),
    _m("wait", JobView, "Block until the job ends; its final view (JobTimeout after timeout).",
       _JOB, Arg("timeout", WAIT_TIMEOUT, None, "seconds to wait (the job itself goes on)",
                 positional=True),
       how="deferred"),
    _m("job", JobView, "The job now; ``position`` is its place in the queue while it waits.",
       _JOB, safe=True),
    _m("jobs", tuple[JobView, ...], "The jobs the engine holds, without their results: the "
       "running ones, then the queue in the order it runs, then the recent finished ones, "
       "newest first.",
       Arg("state", STR, None, "only jobs in these states: a comma-separated list of states, "
           "or active / finished", check=states_problem),
       Arg("backends", STRS, (), "only these backends' jobs", wire="backend",
           check=at_most_items(MAX_LISTED_BACKENDS)),
       Arg("limit", INT, DEFAULT_LIMIT, "at most this many jobs", check=limit_problem),
       safe=True),
    _m("job_request", "JobRequest", "The request a job was submitted with (bounded), while the "
       "engine keeps it.", _JOB,
       Arg("limit", INT, 65536, "bytes of it to send at most", check=between(0, 64 << 20)),
       safe=True),
    _m("cancel", JobView, "Cancel a queued or running job (a running one gets its grace).",
       _JOB, mutating=True),
    _m("cancel_many", "CancelResult...", "Cancel several jobs; one result each "
       "(an unknown job's says so).",
       Arg("job_ids", STRS, doc="the jobs' ids", positional=True, wire="jobs",
           check=at_most_items(10_000)),
       mutating=True),
    _m("retry", str, "Run a finished job's request again as a new job; the new id.", _JOB,
       mutating=True),
    _m("set_priority", JobView, "Give a queued job another priority (higher runs first).",
       _JOB, Arg("priority", PRIORITY, doc="the new priority", positional=True),
       mutating=True),
    # -- backends ------------------------------------------------------------------------------
    _m("evict", type(None), "Stop an idle backend's worker and free its memory.", _BACKEND,
       mutating=True),
    _m("respawn", type(None), "Restart a backend's worker (a new process; failures forgotten).",
       _BACKEND, mutating=True),
    _m("preload", type(None), "Start a backend's worker now, before any job.", _BACKEND,
       mutating=True),
    _m("kill", type(None), "SIGKILL a (stuck) backend's worker now; its jobs fail, saying so.",
       _BACKEND, mutating=True),
    _m("sleep", type(None), "Put a backend's idle worker to sleep: its GPU memory given back, "
       "its process kept (it needs @worker_sdk.sleep and @worker_sdk.wake).", _BACKEND,
       mutating=True),
    _m("wake", type(None), "Wake a backend's sleeping worker (once what waking takes fits).",
       _BACKEND, mutating=True),
    _m("zero", tuple[str, ...], "Evict every idle worker; the backends evicted.",
       mutating=True),
    _m("drain", tuple[int, ...], "Flag a GPU draining (its running work finishes, nothing new "
       "is admitted there) or open it again; the GPUs draining now.",
       Arg("gpu", INT, doc="the GPU's index", positional=True, check=at_least(0)),
       Arg("on", BOOL, True, "True: drain; False: admit work there again", positional=True),
       mutating=True),
    _m("yield_gpus", "YieldInfo...", "Hand GPUs over to programs the engine does not manage: "
       "nothing new starts there, running jobs finish (or are cancelled with now), every "
       "model there is unloaded, until resumed or the duration ends; queued jobs wait.",
       Arg("gpus", INTS, (), "the GPUs' indexes (none: every GPU)", positional=True),
       Arg("for_s", NUM, None, "seconds until it resumes by itself (default: until resumed)",
           check=_positive_duration),
       Arg("now", BOOL, False, "cancel the jobs running there rather than let them finish"),
       Arg("by", STR, "", "who asks (shown with the yield; default: the engine's user)",
           check=_short_name),
       mutating=True),
    _m("resume_gpus", tuple[int, ...], "Take yielded GPUs back (none: every yielded GPU); "
       "the GPUs resumed.",
       Arg("gpus", INTS, (), "the GPUs' indexes (none: every yielded GPU)", positional=True),
       mutating=True),
    _m("reload", "ReloadResult", "Read the backend descriptors again and apply what changed "
       "(a file with errors leaves its backends as they were).", mutating=True),
    _m("descriptor", "DescriptorInfo", "A backend's descriptor: each file's entry for it and "
       "what the engine runs with now.", _BACKEND, safe=True),
    _m("calibration_report", "ReportFile", "A backend's latest calibration report (or the one "
       "named), as the JSON the engine wrote.", _BACKEND,
       Arg("name", STR, None, "a report's file name (default: the latest)"),
       safe=True),
    _m("calibrate", str, "Queue a calibration run of a backend; its job id.",
       _BACKEND,
       Arg("repeats", INT, 3, "requests to run one after another", check=between(1, 100)),
       Arg("request", BYTES, None, "the request each repeat sends (default: the "
           "descriptor's calibration request)"),
       Arg("settle_s", NUM, 1.0, "seconds to let the memory settle after each phase",
           check=between(0.0, 600.0)),
       mutating=True),
    # -- looking -------------------------------------------------------------------------------
    _m("snapshot", EngineSnapshot, "The whole engine at this instant.",
       Arg("light", BOOL, False, "leave out the GPUs' history, the recent jobs and the log"),
       Arg("data_limit", INT, None, "job data and chunks over this many bytes are left out "
           "(-1: keep all; default 64 KiB)", side="wire"),
       safe=True),
    _m("subscribe", dict, "Events as they happen (bounded; ``lagged`` says some were "
       "dropped).",
       Arg("kinds", STRS, None, "the event kinds wanted (job, chunk, worker, sample, log, sleep)"),
       Arg("maxsize", INT, 1000, "the subscription's queue length", side="local"),
       Arg("callback", ANY, None, "called on the engine's (or the reader's) thread instead "
           "of queueing", side="local"),
       Arg("job_id", STR, None, "one job's events only", side="wire", wire="job"),
       how="stream"),
    _m("logs", "LogChunk", "The last lines of a backend's worker log, or what follows offset.",
       _BACKEND,
       Arg("lines", INT, 50, "lines from the end", check=between(0, MAX_LOG_LINES)),
       Arg("offset", INT, None, "continue from here (the offset of the last chunk)",
           check=at_least(0)),
       safe=True),
    _m("stop", type(None), "Embedded: stop the engine (running jobs get their grace). "
       "Client: close this client (the engine goes on).",
       Arg("timeout", NUM, None, "seconds before the workers are killed", positional=True,
           side="local"),
       how="local"),
    # -- the wire only -------------------------------------------------------------------------
    _m("ping", str, "Answers 'pong' (Client.ping times the round trip).", facade=False,
       safe=True),
    _m("unsubscribe", type(None), "End a subscription of this connection.",
       Arg("sub", INT, doc="the subscription's id"), facade=False, client=None),
    _m("stats", dict, "The control server's counters and connections.", facade=False,
       safe=True),
    _m("shutdown", tuple[str, ...], "Stop the engine, as SIGTERM does; the running jobs it "
       "lets finish first (within their stop grace).",
       Arg("now", BOOL, False, "stop at once, as a second SIGTERM does: running jobs are "
           "interrupted (journaled ones run again on the next start)"),
       facade=False, client="shutdown_engine", mutating=True),
)}

WIRE_METHODS = frozenset(name for name, m in METHODS.items() if m.how != "local")
