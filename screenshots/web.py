"""Screenshot of the dashboard in a browser: headless Chromium on ``/ui`` of a served engine.

Starts ``vramtui --serve --http 127.0.0.1:PORT`` (a simulated 24 GiB GPU and the demo
backends, in a fresh /tmp root, with a few demo jobs), opens ``/ui/`` in headless Chromium
(Debian's ``chromium``), waits through the DevTools protocol until the terminal shows the
dashboard, and writes ``screenshots/web-dashboard.png``.  Needs ``chromium`` on the PATH and
the http extra.

Run: ``.venv/bin/python screenshots/web.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(root: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    out = open(root / "serve.out", "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen([sys.executable, "-m", "vramtui", "--serve", "--gpus", "sim:24GiB",
                             "--http", f"127.0.0.1:{port}"], env=env, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while b"HTTP front door" not in (root / "serve.out").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("vramtui --serve did not start: "
                               + (root / "serve.out").read_text(errors="replace")[-2000:])
        time.sleep(0.1)
    return proc


def demo_jobs(port: int) -> None:
    import urllib.request

    for backend, body in (("whisper-sim", {"steps": 200, "step_s": 0.1}),
                          ("sdxl-sim", {"steps": 200, "step_s": 0.1}),
                          ("flux-sim", {}), ("llm-8b-sim", {"messages": [
                              {"role": "user", "content": "hi"}]})):
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/jobs",
            data=json.dumps({"backend": backend, "input": body}).encode(),
            headers={"Content-Type": "application/json", "Prefer": "respond-async"})
        urllib.request.urlopen(req, timeout=10).read()


async def capture(browser: str, url: str, out: Path, width: int, height: int,
                  timeout: float = 60.0, settle: float = 3.0) -> None:
    """Open ``url`` in headless Chromium and save a PNG once the terminal has drawn."""
    import aiohttp

    profile = Path(tempfile.mkdtemp(prefix="vt-chromium-"))
    proc = subprocess.Popen([browser, *CHROMIUM_FLAGS, f"--window-size={width},{height}",
                             f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "about:blank"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                pages = [p for p in await r.json() if p.get("type") == "page"]
            async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                ids = iter(range(1, 1_000_000))

                async def call(method: str, **params: object) -> dict:
                    msg_id = next(ids)
                    await ws.send_json({"id": msg_id, "method": method, "params": params})
                    async for msg in ws:
                        data = json.loads(msg.data)
                        if data.get("id") == msg_id:
                            return data.get("result", {})
                    raise RuntimeError("DevTools closed")

                await call("Page.enable")
                await call("Page.navigate", url=url)
                probe = ("document.body && document.body.classList.contains('-first-byte')")
                while True:
                    got = await call("Runtime.evaluate", expression=probe)
                    if got.get("result", {}).get("value"):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError("the dashboard did not draw in the browser")
                    await asyncio.sleep(0.2)
                await asyncio.sleep(settle)  # let the dashboard fill in (a few snapshots)
                shot = await call("Page.captureScreenshot", format="png")
                out.write_bytes(base64.b64decode(shot["data"]))
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


def make(out: Path, width: int = 1280, height: int = 800, settle: float = 3.0,
         demo: bool = True) -> Path:
    browser = chromium()
    if browser is None:
        raise RuntimeError("no chromium on the PATH (apt-get install chromium)")
    root = Path(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
    port = free_port()
    proc = start_engine(root, port)
    try:
        if demo:
            demo_jobs(port)
        asyncio.run(capture(browser, f"http://127.0.0.1:{port}/ui/", out, width, height,
                            settle=settle))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "screenshots" / "web-dashboard.png"))
    args = parser.parse_args()
    print(make(Path(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
