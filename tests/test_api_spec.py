"""The one list of API methods (supervisor.apispec) against everything that speaks the API.

Each face is checked against the list, not against another face: the Protocol, the embedded
facade, the client and the deterministic FixedSource have exactly the listed methods with the
listed parameters; the control server answers exactly the listed wire methods; the HTTP door
carries each listed method on a route of its table or says why not; the same bad argument
gets the same error embedded and over the socket.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from fixed_source import FixedSource
from serve_support import RawConn, in_process, request

from supervisor.api import EngineAPI
from supervisor.apispec import METHODS, REQUIRED, WIRE_METHODS, Method
from supervisor.client import Client
from supervisor.control.methods import Methods, handler_names
from supervisor.errors import InvalidRequest
from supervisor.facade import Supervisor
from supervisor.http import llama_swap_routes, ollama_routes, openai_routes, route_table, routes

FACADE = {name: m for name, m in METHODS.items() if m.facade}


def params(cls: type, name: str) -> list[tuple[str, Any, Any]]:
    fn = getattr(cls, name, None)
    assert fn is not None, f"{cls.__name__} has no method {name}"
    out = []
    for p in list(inspect.signature(fn).parameters.values())[1:]:  # without self
        out.append((p.name, p.kind, p.default))
    return out


def expected(m: Method, *, client: bool = False) -> list[tuple[str, Any, Any]]:
    out = []
    for a in m.signature_args(client=client):
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if a.positional else \
            inspect.Parameter.KEYWORD_ONLY
        out.append((a.name, kind, inspect.Parameter.empty if a.default is REQUIRED
                    else a.default))
    return out


def same(got: list[tuple[str, Any, Any]], want: list[tuple[str, Any, Any]]) -> bool:
    """Positional parameters in order; keyword-only ones in any order."""
    def split(ps: list[tuple[str, Any, Any]]) -> tuple[list[Any], set[Any]]:
        pos = [p for p in ps if p[1] != inspect.Parameter.KEYWORD_ONLY]
        kw = {p for p in ps if p[1] == inspect.Parameter.KEYWORD_ONLY}
        return pos, kw
    return split(got) == split(want)


@pytest.mark.parametrize("cls", [EngineAPI, Supervisor, FixedSource], ids=lambda c: c.__name__)
def test_every_face_has_the_listed_methods_with_the_listed_parameters(cls: type) -> None:
    for name, m in FACADE.items():
        got, want = params(cls, name), expected(m)
        assert same(got, want), f"{cls.__name__}.{name}{got} drifted from the spec {want}"


def test_the_protocol_has_nothing_the_list_lacks() -> None:
    declared = {n for n, _ in inspect.getmembers(EngineAPI, inspect.isfunction)
                if not n.startswith("_")}
    assert declared == set(FACADE)


def test_the_client_has_every_method_and_the_wire_extras() -> None:
    for name, m in METHODS.items():
        if m.client_name is None:
            continue
        got = params(Client, m.client_name)
        if m.facade:
            assert same(got, expected(m, client=True)), f"Client.{name}{got}"
        for a in m.args:  # wire arguments the client reaches through a method of their own
            if a.via is not None:
                assert a.name in {p[0] for p in params(Client, a.via)} or a.name in (
                    "wait", "follow"), f"Client.{a.via} lacks {a.name}"


def test_the_server_answers_exactly_the_listed_wire_methods() -> None:
    assert set(handler_names(Methods)) == WIRE_METHODS

    class Stray(Methods):
        def _do_frobnicate(self, *args: object) -> None: ...

    with pytest.raises(TypeError, match="frobnicate"):
        handler_names(Stray)


def test_the_http_door_carries_every_listed_method_or_says_why_not() -> None:
    route_table.check(METHODS)
    # a method added to the list without its route fails the check (and every HTTP start)
    added = {**METHODS, "frobnicate": Method("frobnicate", (), None, "a new method")}
    with pytest.raises(TypeError, match="'frobnicate'.*neither carries it nor says why"):
        route_table.check(added)
    # a route that changes the engine is a POST, so that the guard asks for the token
    as_get = tuple(dataclasses.replace(r, method="GET") if r.api == "cancel" else r
                   for r in route_table.ROUTES)
    with pytest.raises(TypeError, match="cancel changes the engine: it must be a POST"):
        route_table.check(METHODS, as_get)
    twice = (*route_table.ROUTES, route_table.Route("GET", "/v1/again", "", api="job"))
    with pytest.raises(TypeError, match="job is carried by two routes"):
        route_table.check(METHODS, twice)
    with pytest.raises(TypeError, match="both on HTTP"):
        route_table.check(METHODS, not_on_http={**route_table.NOT_ON_HTTP, "job": "no"})


def test_the_http_app_serves_exactly_the_route_table() -> None:
    server: Any = SimpleNamespace(engine=SimpleNamespace(backends={}))  # (HttpServer's one)
    app = web.Application()
    for module in (routes, openai_routes, ollama_routes, llama_swap_routes):
        module.add_routes(app, server)
    served = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.method != "HEAD" and r.resource is not None}
    table = {(r.method, re.sub(r"\{(\w+):[^}]*\}", r"{\1}", r.path))
             for r in route_table.ROUTES}
    assert served == table


@pytest.mark.process
def test_arguments_are_checked_by_the_list_alike_embedded_and_remote() -> None:
    spec = METHODS["submit"]
    # a value with an edge rule of its own gets supervisor.validate's words, at every door
    with pytest.raises(InvalidRequest, match="priority must be a whole number"):
        spec.check({"backend": "echo", "priority": "high"})
    with pytest.raises(InvalidRequest, match="'backend' must be str"):
        spec.check({"backend": 7})
    assert spec.check({"backend": "echo", "payload": "text"})["payload"] == b"text"
    with pytest.raises(InvalidRequest, match="between 1 and 100"):
        METHODS["calibrate"].check({"backend": "echo", "repeats": 0})
    with in_process() as (sup, _server, _root):
        c = Client(sup.paths.control_socket)
        for face in (sup, c):
            with pytest.raises(InvalidRequest) as err:
                face.calibrate("echo", repeats=1000)
            assert "between 1 and 100" in str(err.value)
            with pytest.raises(InvalidRequest, match="wait timeout must be a number"):
                face.wait("j-x", timeout="soon")  # type: ignore[arg-type]
        # the server checks what a client that is not ours sends, with the same words
        raw = RawConn(sup.paths.control_socket)
        raw.hello()
        raw.send(request(7, "calibrate", backend="echo", repeats=1000))
        reply = raw.recv().payload
        assert reply["type"] == "InvalidRequest" and "between 1 and 100" in reply["error"]
        raw.close()
        c.close()


def test_a_refused_argument_says_what_was_sent_not_a_python_type_name() -> None:
    """``[1, null]`` for a list of ids said "must be a list of strings, not list"; 10,001
    ids quoted the first 60 characters of a tuple."""
    from supervisor.apispec import METHODS
    from supervisor.errors import InvalidRequest

    with pytest.raises(InvalidRequest) as err:
        METHODS["cancel_many"].check({"job_ids": [1, None]})
    assert "must be a list of strings, not a list holding NoneType, int" in str(err.value)
    with pytest.raises(InvalidRequest) as err:
        METHODS["cancel_many"].check({"job_ids": [f"j-{i}" for i in range(10_001)]})
    assert str(err.value).endswith("takes at most 10000 items (got 10001 of them)")
