"""The README's descriptor reference names every key the schema takes (a key added without a
line there fails here), each with an example of itself."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from waiting import wait_until

from supervisor.backends.http import HTTP_KEYS
from supervisor.backends.schema import CALIBRATION_KEYS, TIMEOUT_KEYS, TOP_KEYS, VRAM_KEYS

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_descriptor_key_has_a_line_with_an_example() -> None:
    rows = re.findall(r"^\| `([a-z_.]+)` \| (.+?) \| `(.+?)` \|$", README.read_text(), re.M)
    documented = {key for key, _what, _example in rows}
    wanted = (set(TOP_KEYS) - {"vram", "timeouts", "calibration"}) | {"vram"}
    wanted |= {f"vram.{k}" for k in VRAM_KEYS} | {f"timeouts.{k}" for k in TIMEOUT_KEYS}
    wanted |= {f"calibration.{k}" for k in CALIBRATION_KEYS} | {"on_overuse", "api"}
    wanted |= {f"http.{k}" for k in HTTP_KEYS}
    assert wanted <= documented, sorted(wanted - documented)
    for key, _what, example in rows:
        assert example.split(":")[0].strip() == key.split(".")[0], (key, example)



# -- the command line, as written ------------------------------------------------------------

FOLLOWS_S = 0.5  # ``vramtui events`` and ``logs -f`` follow until stopped: this long here


def readme_commands() -> list[str]:
    """The lines of the README's command-line block (the one said to run as written)."""
    text = README.read_text()
    start = text.index("Each line runs as written against the demo backends")
    block = text[text.index("```bash\n", start) + 8:]
    return [line for line in block[:block.index("```")].splitlines() if line.strip()]


@pytest.mark.process
def test_every_command_line_of_the_readme_runs_against_the_demo_as_written(
        tmp_path: Path) -> None:
    lines = readme_commands()
    assert lines[0].startswith("vramtui --serve") and lines[-1].startswith("vramtui stop")
    root = Path(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"), HOME=str(root),  # nothing configured
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    # Followers run a few seconds, then count as done; every other failure stops the script.
    script = ["set -eo pipefail",
              f'vramtui() {{ case " $* " in *" events "*|*" -f "*) timeout {FOLLOWS_S} vramtui '
              '"$@" || [ $? = 124 ];; *) command vramtui "$@";; esac; }']
    for number, line in enumerate(lines[1:], start=2):
        script += [f"echo {shlex.quote(f'@@ line {number}: {line}')} >&2", line]
    serve = subprocess.Popen(["bash", "-c", lines[0]], env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: subprocess.run(["vramtui", "status"], env=env, capture_output=True
                                          ).returncode == 0 or serve.poll() is not None,
                   60, "the engine to answer")
        done = subprocess.run(["bash", "-c", "\n".join(script)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Traceback" not in done.stderr and "error:" not in done.stderr, done.stderr
        assert serve.wait(30) == 0  # the last line stopped it
    finally:
        if serve.poll() is None:
            serve.terminate()
            serve.wait(30)
        shutil.rmtree(root, ignore_errors=True)


# -- the OpenAI and Ollama clients, as written --------------------------------------------------


def readme_python(marker: str) -> str:
    """The README's Python block that contains ``marker``."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)
    return next(b for b in blocks if marker in b)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.process
def test_the_openai_and_ollama_examples_run_against_the_demo_as_written(tmp_path: Path) -> None:
    examples = [readme_python("from openai import OpenAI"), readme_python("import ollama")]
    serve = re.search(r"# pip install openai; (vramtui --serve --http 127\.0\.0\.1:8080)\b",
                      examples[0])
    assert serve, "the OpenAI example says how to start the engine it talks to"
    port = free_port()  # 8080 may be taken here: the one change made to what the README says
    root = Path(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"), HOME=str(root),  # nothing configured
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    proc = subprocess.Popen(shlex.split(serve.group(1).replace("8080", str(port))), env=env,
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        def answers() -> bool:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        wait_until(answers, 60, "the HTTP front door")
        for example in examples:
            done = subprocess.run([sys.executable, "-c", example.replace("8080", str(port))],
                                  env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr[-3000:]
            assert done.stdout.startswith("Hello from llm-8b-sim, a simulated"), done.stdout
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)
