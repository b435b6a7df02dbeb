"""``vramtui web``: the dashboard in a browser, attached to the running engine.

The arguments live here; the server is :func:`vramtui.web.run_web` (the dashboard's app is
also what ``--serve --http`` serves at ``/ui``).
"""

from __future__ import annotations

import argparse


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default="127.0.0.1:8081", metavar="ADDR",
                   help="where to listen (default 127.0.0.1:8081; anything but loopback "
                        "needs a token)")
    p.add_argument("--token-file", metavar="FILE",
                   help="the bearer token (or VRAMTUI_HTTP_TOKEN); open /ui/?token=TOKEN once")
    p.add_argument("--readonly", action="store_true",
                   help="the browser may look but change nothing")


def run(args: argparse.Namespace) -> int:
    from ..web import run_web

    return run_web(args)
