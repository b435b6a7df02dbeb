"""The dashboard, attached to a running engine, saved as an SVG screenshot.

    python -m devicecheck.shot SOCKET OUT.svg [--size 160x48] [--expect TEXT ...] [--polls N]

Runs the real Textual app (``VramApp``) headless against the engine's control socket, waits
until it has drawn ``--polls`` snapshots of the engine, and writes the screenshot atomically.
Prints one JSON line: the path, its size, and which ``--expect`` texts the picture shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path


def _shows(svg: str, text: str) -> bool:
    # Textual's SVG writes each space as a non-breaking one
    return text in svg or text.replace(" ", "&#160;") in svg


async def shoot(socket: str, out: Path, size: tuple[int, int], polls: int,
                timeout: float) -> str:
    from supervisor.client import Client
    from vramtui.app import VramApp
    from vramtui.connect import describe

    client = Client(socket)
    try:
        app = VramApp(client, describe(client), readonly=True)
        async with app.run_test(size=size) as pilot:
            deadline = time.monotonic() + timeout
            while getattr(app, "polls", polls) < polls:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the dashboard drew no {polls} snapshots in "
                                       f"{timeout:g} s")
                await pilot.pause(0.1)
            await pilot.pause()
            svg = app.export_screenshot(title="vramtui — device check")
    finally:
        client.close()
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(svg)
    os.replace(tmp, out)
    return svg


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="devicecheck.shot")
    parser.add_argument("socket")
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", default="160x48")
    parser.add_argument("--expect", action="append", default=[])
    parser.add_argument("--polls", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    cols, rows = (int(n) for n in args.size.lower().split("x"))
    svg = asyncio.run(shoot(args.socket, args.out, (cols, rows), args.polls, args.timeout))
    print(json.dumps({"path": str(args.out), "bytes": len(svg.encode()),
                      "shows": {t: _shows(svg, t) for t in args.expect}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
