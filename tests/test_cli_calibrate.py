"""``vramtui calibrate``/``recalibrate`` and the over-declared flag of ``vramtui backends``.

A real ``vramtui --serve`` subprocess on a simulated 8 GiB GPU serves the module; every
command is its own process.  ``steady`` (examples/calibration/steady.py) holds a 256 MiB
context + 1000 MiB of weights + 500 MiB while a request runs: its peak is 1756 MiB.
"""

from __future__ import annotations

import json
import os
import pty
import queue
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_support import ROOT, sim_backend
from serve_support import PYTHON, Served, cli, make_env, new_root, reap, start_serve
from spawning import spawns

from supervisor.jobs import JobState

EXAMPLES = ROOT / "examples" / "calibration"
STEADY_PEAK = 256 + 1000 + 500
FAST = ("--repeats", "2", "--settle", "0.3")


def calibration_backend(name: str, *, weights: int = 1000, activation: int = 500,
                        predict_s: float = 0.2) -> dict[str, Any]:
    return {
        "name": name,
        "script": str(EXAMPLES / "steady.py"),
        "vram": "6GiB",
        "env": {"SIM_WEIGHTS_MIB": str(weights), "SIM_ACTIVATION_MIB": str(activation),
                "SIM_LOAD_S": "0.05", "SIM_PREDICT_S": str(predict_s)},
        "timeouts": {"stop_grace": "3s", "start": "20s"},
    }


def backends() -> list[dict[str, Any]]:
    # ``under`` declares 1 GiB but really holds 256 + 1000 + 500 MiB; its jobs last 2 s
    # (the engine samples processes at 2 Hz outside calibrations).
    under = sim_backend("under", 1000, 500, steps=8, step_s=0.25)
    under["vram"] = {"peak": "1GiB"}
    return [calibration_backend("steady"),
            calibration_backend("stuck", predict_s=30),  # for Ctrl-C
            sim_backend("flaky", 500, 100),  # fails on {"fail": true}
            under]


@pytest.fixture(scope="module")
@spawns
def served() -> Iterator[Served]:
    root = new_root()
    s = start_serve(make_env(root, backends()), root)
    yield s
    reap(s)


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = cli(env, *args, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("vramtui: error: ")
    return lines[0]


def figure_rows(text: str) -> list[str]:
    """The results table's rows (figure, value, spread, samples), as text."""
    return [" ".join(line.replace("│", " ").split()) for line in text.splitlines()
            if re.match(r"│ (context|weights|activation|peak) ", line)]


def backend_json(env: dict[str, str], name: str) -> dict[str, Any]:
    done = run(env, "backends", "--json")
    assert done.returncode == 0, done.stderr
    return next(b for b in json.loads(done.stdout) if b["name"] == name)


def on_a_terminal(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str],
                                                            str]:
    """``vramtui ARGS`` with stderr on a pseudo-terminal (so it shows its progress bar)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([PYTHON, "-m", "vramtui", *args], env={**env, "TERM": "xterm"},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
        os.close(master)
    terminal = b"".join(chunks).decode(errors="replace")
    assert "Traceback" not in terminal, terminal
    return (subprocess.CompletedProcess(proc.args, proc.returncode,
                                        stdout.decode(errors="replace"), terminal), terminal)


@dataclass
class Calibrated:
    done: subprocess.CompletedProcess[str]
    terminal: str
    out: Path  # --report: the JSON report's copy
    overlay_out: Path  # --out: the overlay, vramd's meaning
    report: Path
    overlay: Path


@pytest.fixture(scope="module")
@spawns
def calibrated(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Calibrated:
    """``vramtui calibrate steady --repeats 2 --out FILE --report FILE``, once for the module."""
    folder = tmp_path_factory.mktemp("cal")
    out, overlay_out = folder / "steady-report.json", folder / "steady.yaml"
    done, terminal = on_a_terminal(served.env, "calibrate", "steady", *FAST, "--report",
                                   str(out), "--out", str(overlay_out))
    assert done.returncode == 0, (done.stdout, terminal)
    report = re.search(r"^report: (\S+)$", done.stdout, re.M)
    overlay = re.search(r"^overlay: (\S+) ", done.stdout, re.M)
    assert report and overlay, done.stdout
    return Calibrated(done, terminal, out, overlay_out, Path(report.group(1)),
                      Path(overlay.group(1)))


def test_calibrate_measures_writes_the_overlay_and_backends_show_it(
        served: Served, calibrated: Calibrated) -> None:
    text = calibrated.done.stdout
    rows = figure_rows(text)
    assert rows[0].startswith("context 256 MiB") and rows[1].startswith("weights 1000 MiB")
    assert rows[2].startswith("activation 500 MiB")
    assert rows[3].startswith(f"peak {STEADY_PEAK} MiB 0 MiB"), rows  # value, spread
    assert "confidence: high" in text and "findings: none" in text
    # The progress bar showed the run's phases, by name.
    assert re.search(r"(initialize|settle-load|predict-[12]|settle-[12]|shutdown|exited): ",
                     calibrated.terminal), calibrated.terminal
    # The overlay, in the config's backends.d, and the engine admits by it from now on.
    assert calibrated.overlay == served.paths.backends_dir / "zz-calibrated-steady.yaml"
    written = yaml.safe_load(calibrated.overlay.read_text())
    assert written["name"] == "steady" and written["vram"]["peak"] == f"{STEADY_PEAK}MiB"
    assert backend_json(served.env, "steady")["declared_peak_mib"] == STEADY_PEAK
    # --report: a byte copy of the report; --out: the overlay (vramd's meaning of --out).
    assert calibrated.report.parent == served.paths.calibration_dir
    assert calibrated.out.read_bytes() == calibrated.report.read_bytes()
    assert f"report copied to: {calibrated.out}" in text
    assert yaml.safe_load(calibrated.overlay_out.read_text()) == written
    assert f"overlay written to: {calibrated.overlay_out}" in text


def test_recalibrate_without_an_engine_gives_the_same_numbers(
        calibrated: Calibrated) -> None:
    root = new_root()
    try:
        env = make_env(root)  # no engine runs here
        done = run(env, "recalibrate", str(calibrated.out))
        assert done.returncode == 0, done.stderr
        assert figure_rows(done.stdout) == figure_rows(calibrated.done.stdout)
        assert "same figures, confidence and findings as the stored analysis" in done.stdout
        as_json = json.loads(run(env, "recalibrate", str(calibrated.out), "--json").stdout)
        assert as_json["peak_mib"] == STEADY_PEAK and as_json["changed"] == []
        assert as_json["overlay"] is None
        written = run(env, "recalibrate", str(calibrated.out), "--write-overlay")
        assert written.returncode == 0, written.stderr
        overlay = root / "cfg" / "backends.d" / "zz-calibrated-steady.yaml"
        assert yaml.safe_load(overlay.read_text())["vram"]["peak"] == f"{STEADY_PEAK}MiB"
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_recalibrate_says_what_changed(calibrated: Calibrated, tmp_path: Path) -> None:
    document = json.loads(calibrated.out.read_text())
    document["analysis"]["peak"]["value_mib"] = 9999  # as an older analysis might have said
    document["analysis"]["confidence"] = "medium"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(document))
    done = run(make_env(tmp_path), "recalibrate", str(edited))
    assert done.returncode == 0, done.stderr
    assert "changed from the stored analysis:" in done.stdout
    assert f"peak: 9999 MiB (spread 0 MiB) -> {STEADY_PEAK} MiB" in done.stdout
    assert "confidence: medium -> high" in done.stdout


def test_bad_inputs_are_one_line_errors(served: Served, tmp_path: Path) -> None:
    env = make_env(tmp_path)  # recalibrate needs no engine
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\xffnot json at all")
    done = run(env, "recalibrate", str(garbage))
    assert done.returncode == 2 and "cannot read the calibration report" in one_line_error(done)
    other = tmp_path / "other.json"
    other.write_text('{"format": "something else"}')
    done = run(env, "recalibrate", str(other))
    assert done.returncode == 2 and "not a vramtui calibration report" in one_line_error(done)
    done = run(env, "recalibrate", str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "missing.json" in one_line_error(done)
    done = run(served.env, "calibrate", "steady", "--request", "{bad")
    assert done.returncode == 2 and "bad JSON in --request" in one_line_error(done)
    done = run(served.env, "calibrate", "steady", "--request-file", str(tmp_path / "none"))
    assert done.returncode == 2 and "cannot read --request-file" in one_line_error(done)
    done = run(served.env, "calibrate", "steady", "--repeats", "0")
    assert done.returncode == 2 and "--repeats" in one_line_error(done)
    done = run(served.env, "calibrate", "steady", "--out", str(tmp_path / "no" / "x.yaml"))
    assert done.returncode == 2 and "does not exist" in one_line_error(done)
    done = run(served.env, "calibrate", "steady", "--report", str(tmp_path))
    assert done.returncode == 2 and "--report" in one_line_error(done)
    done = run(served.env, "calibrate", "nope")
    assert done.returncode == 4 and "nope" in one_line_error(done)
    done = run(env, "calibrate", "steady")  # no engine runs for env
    assert done.returncode == 3 and "vramtui --serve" in one_line_error(done)


def test_a_failed_run_exits_1_and_says_why(served: Served) -> None:
    done = run(served.env, "calibrate", "flaky", *FAST, "--json",
               "--request", '{"fail": true, "steps": 4, "step_s": 0.05}')
    assert done.returncode == 1
    summary = json.loads(done.stdout)
    assert summary["state"] == "failed" and summary["outcome"] == "failed"
    assert "overlay" not in summary and Path(summary["report"]).is_file()
    line = one_line_error(done)
    assert "the run failed: predict 1 failed" in line and "simulated failure" in line
    assert not (served.paths.backends_dir / "zz-calibrated-flaky.yaml").exists()


def test_ctrl_c_cancels_the_run(served: Served) -> None:
    proc = subprocess.Popen([PYTHON, "-m", "vramtui", "calibrate", "stuck", *FAST],
                            env=served.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        while not any("predict-1" in line for line in seen):  # a phase line per phase
            line = lines.get(timeout=60)
            assert line is not None, "".join(seen)
            seen.append(line)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    while (line := lines.get(timeout=10)) is not None:
        seen.append(line)
    text = "".join(seen)
    assert proc.returncode == 130, text
    assert "Traceback" not in text
    cancelled = re.search(r"the calibration of stuck \(job (j-[0-9a-f]+)\) is cancelled", text)
    assert cancelled, text
    with served.client() as client:
        assert client.wait(cancelled.group(1), 30).state is JobState.CANCELLED
    assert not (served.paths.backends_dir / "zz-calibrated-stuck.yaml").exists()


def test_backends_flags_an_observed_peak_above_the_declared_one(served: Served) -> None:
    assert backend_json(served.env, "under")["over_declared"] is False
    done = run(served.env, "submit", "under", "--data", "{}", "--wait")
    assert done.returncode == 0, done.stderr
    under = backend_json(served.env, "under")
    assert under["declared_peak_mib"] == 1024 and under["observed_p95_mib"] == STEADY_PEAK
    # observed p95 + 5 %, rounded up to 64 MiB: 1756 * 1.05 = 1843.8 -> 1856.
    assert under["over_declared"] is True and under["suggested_peak_mib"] == 1856
    assert backend_json(served.env, "steady")["suggested_peak_mib"] is None
    text = run(served.env, "backends").stdout
    assert "over peak!" in text
    assert ("under: observed p95 1.7 GiB > declared 1.0 GiB: set vram.peak to 1.9 GiB or run "
            "`vramtui calibrate under`") in " ".join(text.split())


@pytest.mark.parametrize("backend", ["../../../elsewhere/pwned", "a/b", 5])
def test_a_report_whose_backend_is_no_name_writes_nothing(
        calibrated: Calibrated, tmp_path: Path, backend: object) -> None:
    """The overlay a report justifies is named after its backend: a report that names a
    path (or a number) is refused as malformed, before any directory is made for it
    (``../`` made folders outside ``backends.d``, then failed with an internal error)."""
    document = json.loads(calibrated.out.read_text())
    document["record"]["backend"] = backend
    crafted = tmp_path / "crafted.json"
    crafted.write_text(json.dumps(document))
    root = tmp_path / "root"
    root.mkdir()
    done = run(make_env(root), "recalibrate", str(crafted), "--write-overlay")
    assert done.returncode == 2 and "is not a backend name" in one_line_error(done)
    assert sorted(p.name for p in root.rglob("*")) == ["backends.yaml"]  # nothing made
    assert not (tmp_path / "elsewhere").exists()
