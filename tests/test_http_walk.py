"""The HTTP door and the CLI tell the same truth: ``echo`` on a simulated GPU is simulated in
``vramtui backends --json`` and in ``GET /v1/backends/echo`` alike."""

from __future__ import annotations

import json

import pytest
from http_support import serve_http
from serve_support import cli, echo_backend

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]


def test_echo_is_simulated_in_the_cli_and_over_http_alike() -> None:
    with serve_http([echo_backend()], control=True) as front:
        over_http = front.get("/v1/backends/echo").json()["simulated"]
        done = cli(front.env, "backends", "--json")
        assert done.returncode == 0, done.stderr
        in_cli = next(b for b in json.loads(done.stdout) if b["name"] == "echo")["simulated"]
        assert over_http is in_cli is True
