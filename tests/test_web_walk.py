"""The browser dashboard asks nothing of any other host, has a title and an icon, and
``vramtui web`` speaks ``--serve``'s flag names, with its own usage for a wrong one."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from http_support import Front, serve_http
from serve_support import cli, echo_backend, make_env, new_root
from spawning import spawns

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    with serve_http([echo_backend()], ui=True) as f:
        yield f


def test_the_page_loads_nothing_from_elsewhere_and_has_a_title_and_an_icon(front: Front
                                                                          ) -> None:
    page = front.get("/ui/")
    assert page.status == 200
    html = page.body.decode()
    assert "<title>vramtui</title>" in html
    assert re.search(r'<link rel="icon" href="data:image/svg\+xml,', html)
    urls = re.findall(r'(?:src|href)="([^"]*)"', html) + re.findall(r'url\("([^"]*)"\)', html)
    assert urls and all(u.startswith(("/", "data:")) for u in urls), urls
    fonts = [u for u in urls if u.endswith(".ttf")]
    assert fonts and all(front.get(u).status == 200 for u in fonts)  # shipped, served here


def test_web_takes_the_flags_of_serve_and_says_its_own_usage() -> None:
    env = make_env(new_root(), [echo_backend()])
    wrong = cli(env, "web", "--bogus")
    assert wrong.returncode == 2 and wrong.stderr.startswith("usage: vramtui web")
    assert "vramtui web: error: unrecognized arguments: --bogus" in wrong.stderr
    env.pop("VRAMTUI_HTTP_TOKEN", None)
    open_door = cli(env, "web", "--http", "0.0.0.0:9")
    assert open_door.returncode == 2 and "lets other machines in" in open_door.stderr
    help_text = cli(env, "web", "--help").stdout
    assert "--http ADDR" in help_text and "--http-token-file FILE" in help_text
    assert "--listen" not in help_text
