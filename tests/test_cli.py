"""The ``vramtui`` client commands as real subprocesses against a real ``vramtui --serve``.

One engine serves the whole module (its jobs are independent); each command is its own
process, as a script would run it.  Every error must be one line and never a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_support import PYTHON, Served, cli, make_env, new_root, reap, start_serve
from spawning import spawns
from waiting import wait_until

from supervisor.jobs import JobState


@pytest.fixture(scope="module")
@spawns
def served() -> Iterator[Served]:
    root = new_root()
    s = start_serve(make_env(root), root)
    yield s
    reap(s)


def run(s: Served, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    done = cli(s.env, *args, input=input)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("vramtui: error: ")
    return lines[0]


def backend_state(s: Served, name: str) -> str:
    done = run(s, "backends", "--json")
    assert done.returncode == 0, done.stderr
    return next(b["state"] for b in json.loads(done.stdout) if b["name"] == name)


def test_submit_wait_prints_the_result(served: Served) -> None:
    done = run(served, "submit", "echo", "--data", '{"x": 1}', "--wait")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"echo": {"x": 1}}


def test_submit_returns_an_id_and_result_fetches_it(served: Served) -> None:
    done = run(served, "submit", "echo", "--data", '{"y": 2}')
    assert done.returncode == 0
    job = done.stdout.strip()
    assert job.startswith("j-")
    result = run(served, "result", job, "--wait")
    assert result.returncode == 0 and json.loads(result.stdout) == {"echo": {"y": 2}}
    as_json = json.loads(run(served, "result", job, "--json").stdout)
    assert as_json["state"] == "succeeded" and as_json["id"] == job
    submitted = json.loads(run(served, "submit", "echo", "--data", "{}", "--json").stdout)
    assert submitted["id"].startswith("j-")


def test_submit_stream_prints_chunks_in_order(served: Served) -> None:
    done = run(served, "submit", "echo", "--data", '{"stream": 5}', "--stream")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "".join(f"chunk {i}\n" for i in range(5))


def test_submit_reads_stdin_and_files(served: Served, tmp_path: Path) -> None:
    done = run(served, "submit", "echo", "-", "--wait", input=b'{"from": "stdin"}')
    assert json.loads(done.stdout) == {"echo": {"from": "stdin"}}
    f = tmp_path / "req.bin"
    f.write_bytes(b"\xff\xferaw")  # not UTF-8: echoed back as bytes, base64 in JSON
    done = run(served, "submit", "echo", "--data-file", str(f), "--wait", "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["data"] == {"base64": "//5yYXc="}


def test_cancel_a_running_job(served: Served) -> None:
    job = run(served, "submit", "slow", "--data", '{"steps": 500, "step_s": 0.02}').stdout.strip()
    wait_until(lambda: json.loads(run(served, "result", job, "--json").stdout)["state"]
             == "running", 30, "the job to run")
    queued = run(served, "submit", "slow", "--data", "{}").stdout.strip()
    pending = run(served, "result", queued)
    assert pending.returncode == 6 and "position 1" in pending.stderr
    assert run(served, "cancel", queued).stdout.strip() == f"job {queued} cancelled"
    assert "being cancelled" in run(served, "cancel", job).stdout
    result = run(served, "result", job, "--wait")
    assert result.returncode == 1 and "cancelled" in one_line_error(result)


def test_preload_evict_respawn_zero(served: Served) -> None:
    assert run(served, "preload", "slow").returncode == 0
    wait_until(lambda: backend_state(served, "slow") == "ready", 30, "slow preloaded")
    assert run(served, "evict", "slow").returncode == 0
    wait_until(lambda: backend_state(served, "slow") == "cold", 30, "slow evicted")
    assert run(served, "respawn", "slow").returncode == 0
    wait_until(lambda: backend_state(served, "slow") == "ready", 30, "slow respawned")
    zero = json.loads(run(served, "zero", "--json").stdout)
    assert "slow" in zero["evicted"]
    wait_until(lambda: backend_state(served, "slow") == "cold", 30, "slow evicted by zero")


def test_status_queue_jobs_backends_logs(served: Served) -> None:
    run(served, "submit", "echo", "--data", "{}", "--wait")
    status = run(served, "status")
    assert status.returncode == 0 and "SIMULATED" in status.stdout and "echo" in status.stdout
    snap = json.loads(run(served, "status", "--json").stdout)
    assert snap["pid"] == served.proc.pid and snap["simulated"] is True
    assert run(served, "queue").returncode == 0
    jobs = json.loads(run(served, "jobs", "--json").stdout)
    assert any(j["backend"] == "echo" for j in jobs["recent"])
    assert "echo" in run(served, "jobs").stdout
    assert "huge" in run(served, "backends").stdout
    logs = run(served, "logs", "echo", "-n", "5")
    assert logs.returncode == 0 and "ready" in logs.stdout


def test_logs_refuses_a_count_of_lines_it_cannot_show(served: Served) -> None:
    """-n -5 was taken as 0: no output and exit 0, as if the log were empty."""
    for count in ("-5", "100001"):
        done = run(served, "logs", "echo", "-n", count)
        assert done.returncode == 2 and done.stdout == ""
        assert f"-n takes a number of lines between 0 and 100000, got {count}" in \
            one_line_error(done)
    assert run(served, "logs", "echo", "-n", "0").returncode == 0


def test_errors_are_one_line_with_exit_codes(served: Served, tmp_path: Path) -> None:
    unknown = run(served, "submit", "nope", "--data", "{}")
    assert unknown.returncode == 4
    assert "known backends: echo, huge, slow" in one_line_error(unknown)
    assert run(served, "result", "j-nope").returncode == 4
    assert run(served, "cancel", "j-nope").returncode == 4
    assert run(served, "evict", "nope").returncode == 4
    assert run(served, "logs", "nope").returncode == 4
    bad = run(served, "submit", "echo", "--data", "{bad")
    assert bad.returncode == 2 and "bad JSON in --data" in one_line_error(bad)
    assert run(served, "submit", "echo", "--metadata", "[1]").returncode == 2
    missing = run(served, "submit", "echo", "--data-file", str(tmp_path / "none"))
    assert missing.returncode == 2 and "cannot read --data-file" in one_line_error(missing)
    too_big = run(served, "submit", "huge", "--data", "{}")
    assert too_big.returncode == 5
    js = run(served, "submit", "nope", "--json")
    assert json.loads(js.stdout)["type"] == "UnknownBackend"


def test_a_request_too_large_is_a_clear_error_not_a_broken_pipe(
        served: Served, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(65 * 1024 * 1024)
    done = run(served, "submit", "echo", "--data-file", str(big))
    assert done.returncode == 2
    line = one_line_error(done)
    assert "request too large" in line and "64 MiB" in line
    assert run(served, "status").returncode == 0  # the engine is fine


@pytest.mark.process
def test_no_engine_says_how_to_start_one(tmp_path: Path) -> None:
    env = make_env(new_root())
    done = cli(env, "status")
    assert done.returncode == 3
    assert "vramtui --serve" in one_line_error(done)
    attach = cli(env, "jobs", "--attach", str(tmp_path / "x.sock"))
    assert attach.returncode == 3 and str(tmp_path / "x.sock") in attach.stderr


def test_doctor_checks_and_says_what_to_fix(served: Served) -> None:
    done = run(served, "doctor", "--json")
    report = json.loads(done.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["engine"]["status"] == "ok" and str(served.proc.pid) in checks["engine"]["detail"]
    assert checks["runtime directory"]["status"] == "ok"
    assert checks["backend echo"]["status"] == "ok"
    # The engine runs from --backends this command was not given: doctor checks those files
    # (a newcomer's walk saw "none configured: the demo backends are used" here).
    assert checks["backend slow"]["status"] == "ok" and "backends" not in checks
    assert "NVML" in checks
    # the engine holds the journal: doctor checks it through the engine, never "locked"
    assert checks["journal"]["status"] == "ok", checks["journal"]
    assert f"in use by engine pid {served.proc.pid}" in checks["journal"]["detail"]
    assert checks["engine state"]["status"] == "ok"
    assert done.returncode == (1 if any(c["status"] == "fail" for c in checks.values()) else 0)


def test_the_cli_imports_no_textual_and_documents_exit_codes(served: Served) -> None:
    # status imports only what it prints with: no Textual, no rich, no engine
    code = ("import sys; from vramtui.cli import main; rc = main(['status']); "
            "bad = [m for m in sys.modules if m.startswith(('textual', 'rich', "
            "'supervisor.engine', 'supervisor.facade', 'yaml'))]; "
            "print(rc, bad, file=sys.stderr)")
    done = subprocess.run([PYTHON, "-c", code], env=served.env, capture_output=True, text=True,
                          timeout=60)
    assert done.stderr.strip().endswith("0 []"), done.stderr
    helped = run(served, "--help")
    assert "exit codes:" in helped.stdout and "no engine is running" in helped.stdout


def test_a_job_state_is_a_jobstate_over_json(served: Served) -> None:
    view = json.loads(run(served, "submit", "echo", "--data", "{}", "--wait", "--json").stdout)
    assert JobState(view["state"]) is JobState.SUCCEEDED


@pytest.mark.process
def test_importing_the_codec_does_not_load_the_worker_runtime() -> None:
    code = ("import sys, worker_sdk.protocol; lean = 'worker_sdk.runner' not in sys.modules; "
            "from worker_sdk import predict, __version__; print(lean, callable(predict))")
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True"], done.stderr


def test_the_one_command_parser_knows_every_command() -> None:
    from vramtui.cli.parser import build_parser, command_named
    from vramtui.cli.registry import COMMANDS

    full = build_parser()
    choices = full._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(choices) == set(COMMANDS)
    assert command_named(["--attach", "/x.sock", "status", "--json"]) == "status"
    assert command_named(["--help", "status"]) is None  # the whole help, every command
    args = build_parser("submit").parse_args(["submit", "echo", "--data", "{}", "--wait"])
    assert (args.command, args.backend, args.wait) == ("submit", "echo", True)


def test_submit_stream_on_a_terminal_leaves_only_the_data(served: Served) -> None:
    """stdout and stderr on one terminal (a pty): what the screen shows at the end is the
    chunks, line by line, and a final newline; the status line has left no trace."""
    import os
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI on the pty
        os.execve(PYTHON, [PYTHON, "-m", "vramtui", "submit", "echo", "--data",
                           '{"stream": 6}', "--stream"], served.env)
    raw = b""
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        raw += data
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, raw
    # the last line is complete: nothing is left after the final newline but erasures
    assert screen_lines(raw) == [f"chunk {i}" for i in range(6)]


def screen_lines(raw: bytes) -> list[str]:
    """The lines a terminal would show for ``raw``: CR, erase-line and newlines applied."""
    lines, line = [], ""
    text = raw.decode(errors="replace").replace("\r\n", "\n")
    i = 0
    while i < len(text):
        if text.startswith("\x1b[2K", i):
            line, i = "", i + 4
            continue
        ch = text[i]
        if ch == "\n":
            lines.append(line)
            line = ""
        elif ch == "\r":
            line = ""  # our writer always erases after a CR
        else:
            line += ch
        i += 1
    if line:
        lines.append(line)
    return lines


def test_jobs_filters_status_json_size_and_wall_clock_times(served: Served) -> None:
    import time

    before = time.time()
    fine = run(served, "submit", "echo", "--data", '{"f": 1}', "--wait")
    assert fine.returncode == 0
    failed = run(served, "submit", "slow", "--data", '{"steps": 2, "fail": true}', "--wait")
    assert failed.returncode == 1
    jobs = json.loads(run(served, "jobs", "--state", "failed", "--json").stdout)
    assert jobs["recent"] and all(j["state"] == "failed" for j in jobs["recent"])
    assert not jobs["running"] and not jobs["queued"]
    only = json.loads(run(served, "jobs", "--backend", "echo", "--limit", "2", "--json").stdout)
    listed = only["running"] + only["queued"] + only["recent"]
    assert 1 <= len(listed) <= 2 and {j["backend"] for j in listed} == {"echo"}
    newest = only["recent"][0]
    # epoch seconds, like taken_at, never the engine's monotonic clock
    assert before - 1 < newest["submitted_at"] <= newest["finished_at"] < time.time() + 1
    assert all(before - 1 < h[0] < time.time() + 1 for h in newest["history"])
    light = run(served, "status", "--json").stdout
    full = json.loads(run(served, "status", "--json", "--history").stdout)
    assert json.loads(light)["gpus"][0]["history"] == [] and full["gpus"][0]["history"]
    assert len(light) < len(json.dumps(full))
    assert abs(full["gpus"][0]["history"][-1][0] - full["taken_at"]) < 10
    text = run(served, "jobs", "--state", "failed").stdout
    assert "simulated failure" in text and "step 2/2" not in text  # no stale progress
    assert run(served, "jobs", "--limit", "0").returncode == 2


def test_cancel_several_priority_retry_kill_drain_reload(served: Served) -> None:
    busy = run(served, "submit", "slow", "--data", '{"steps": 400, "step_s": 0.02}')
    busy_id = busy.stdout.strip()
    wait_until(lambda: json.loads(run(served, "result", busy_id, "--json").stdout)["state"]
             == "running", 30, "the job to run")
    a = run(served, "submit", "slow", "--data", "{}").stdout.strip()
    b = run(served, "submit", "slow", "--data", "{}").stdout.strip()
    moved = run(served, "priority", b, "9")
    assert moved.returncode == 0 and "position 1" in moved.stdout, moved.stdout
    assert run(served, "priority", busy_id, "1").returncode == 5  # running: refused
    both = run(served, "cancel", a, b, "j-nope")
    assert both.returncode == 4 and f"job {a} cancelled" in both.stdout
    assert f"job {b} cancelled" in both.stdout and "unknown job" in both.stderr
    killed = run(served, "kill", "slow")
    assert killed.returncode == 0
    result = run(served, "result", busy_id, "--wait", "--json")
    assert "killed on request" in json.loads(result.stdout)["error"]
    again = run(served, "retry", a, "--json")
    new = json.loads(again.stdout)["id"]
    assert new != a and json.loads(run(served, "result", new, "--json").stdout)["backend"] \
        == "slow"
    run(served, "cancel", new)
    drained = run(served, "drain", "0")
    assert drained.returncode == 0 and "draining" in drained.stdout
    snap = json.loads(run(served, "status", "--json").stdout)
    assert snap["gpus"][0]["draining"] is True
    assert run(served, "drain", "0", "--off").returncode == 0
    assert run(served, "drain", "9").returncode == 4  # unknown GPU
    reload = run(served, "reload")
    assert reload.returncode == 0 and "nothing changed" in reload.stdout


def test_events_follows_the_engine(served: Served) -> None:
    import signal

    proc = subprocess.Popen([PYTHON, "-m", "vramtui", "events", "--json"], env=served.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: json.loads(run(served, "status", "--json").stdout) and
                 run(served, "submit", "echo", "--data", '{"ev": 1}', "--wait").returncode
                 == 0, 30, "a job")
        seen = []
        assert proc.stdout is not None
        while True:
            event = json.loads(proc.stdout.readline())
            seen.append(event)
            if event["kind"] == "job" and event["state"] == "succeeded":
                break
        assert {e["kind"] for e in seen} >= {"job"}
        assert all(abs(e["t"] - seen[-1]["t"]) < 60 for e in seen)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0


def test_only_the_main_thread_of_events_takes_ctrl_c(served: Served) -> None:
    """A signal the kernel hands to the subscription's reader thread would leave the main
    thread waiting on the queue until the next event: that thread blocks them (/proc)."""
    import signal

    proc = subprocess.Popen([PYTHON, "-m", "vramtui", "events"], env=served.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        tasks = Path(f"/proc/{proc.pid}/task")
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

        def blocked(tid: str) -> set[int]:
            status = (tasks / tid / "status").read_text()
            mask = int(next(line.split()[1] for line in status.splitlines()
                            if line.startswith("SigBlk:")), 16)
            return {sig for sig in sigs if mask >> (sig - 1) & 1}

        others = wait_until(lambda: [t for t in os.listdir(tasks) if int(t) != proc.pid],
                            30, "the reader thread")
        # (the main thread blocks them only while it starts the reader, which inherits that)
        wait_until(lambda: not blocked(str(proc.pid)), 5, "the main thread's mask restored")
        for tid in others:
            assert blocked(tid) == set(sigs), tid
    finally:
        proc.send_signal(signal.SIGINT)
        # 0 once it follows; 130 (interrupted) when ctrl+c came as it was still subscribing
        assert proc.wait(20) in (0, 130)


def test_ctrl_c_ends_logs_follow_with_0_as_every_follow(served: Served) -> None:
    import signal

    assert run(served, "submit", "echo", "--data", '{"log": 1}', "--wait").returncode == 0
    wait_until(lambda: run(served, "logs", "echo").stdout.strip(), 30, "echo's log")
    proc = subprocess.Popen([PYTHON, "-m", "vramtui", "logs", "echo", "-f"], env=served.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # it follows now
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        proc.kill()


def test_a_subscription_callback_runs_with_ctrl_c_unblocked(served: Served) -> None:
    """A callback is the caller's code, run on the reader thread: that thread takes signals
    as usual there, so what the callback starts does too (a child inherits the mask)."""
    import signal
    import threading

    masks: list[int] = []

    def callback(_event: object) -> None:
        tid = threading.get_native_id()
        status = Path(f"/proc/self/task/{tid}/status").read_text()
        masks.append(int(next(line.split()[1] for line in status.splitlines()
                              if line.startswith("SigBlk:")), 16))

    with served.client() as client:
        sub = client.subscribe(kinds=["job"], callback=callback)
        try:
            client.wait(client.submit("echo", b'{"cb": 1}'), 30)
            wait_until(lambda: masks, 10, "the callback to run")
        finally:
            sub.close()
    assert not masks[0] >> (signal.SIGINT - 1) & 1


def test_ctrl_c_on_submit_wait_without_a_terminal_names_the_job_that_goes_on(
        served: Served) -> None:
    import signal

    proc = subprocess.Popen([PYTHON, "-m", "vramtui", "submit", "slow", "--wait", "--data",
                             '{"steps": 400, "step_s": 0.05}'], env=served.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        running = wait_until(lambda: [j for j in json.loads(run(
            served, "jobs", "--json").stdout)["running"] if j["backend"] == "slow"], 30,
            "the job under way")
        job_id = running[0]["id"]
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, err
        assert f"job {job_id} goes on (vramtui cancel {job_id}" in err, err
        run(served, "cancel", job_id)
    finally:
        proc.kill()


def test_status_watch_refreshes_until_ctrl_c(served: Served) -> None:
    import signal

    proc = subprocess.Popen([PYTHON, "-m", "vramtui", "status", "-n", "0.2", "--json"],
                            env=served.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        first, second = json.loads(proc.stdout.readline()), json.loads(proc.stdout.readline())
        assert second["taken_at"] > first["taken_at"]  # one compact document per refresh
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    assert run(served, "status", "-n", "0").returncode == 2


def test_engine_start_flags_given_to_a_command_are_said_to_be_ignored(served: Served) -> None:
    # the engine runs on sim:8GiB; these flags would only shape one that starts
    done = run(served, "--gpus", "sim:4GiB", "jobs", "--json")
    assert done.returncode == 0 and "running" in json.loads(done.stdout)  # JSON untouched
    [line] = done.stderr.splitlines()
    assert line == (f"vramtui: warning: --gpus ignored: the engine (pid {served.proc.pid}) "
                    "already runs on Simulated GPU (8 GiB); such options take effect only when "
                    "an engine starts (`vramtui stop` first to start one with them)"), line
    # several, abbreviated, and beside a command's own GPUs (resume's): each named once
    done = run(served, "--gp", "sim:4GiB", "--backends", "a", "--backends", "b", "--max-queue",
               "3", "--http", "127.0.0.1:1", "resume", "0")
    [line] = done.stderr.splitlines()
    assert line.startswith("vramtui: warning: --gpus, --backends, --max-queue, --http ignored: "
                           "the engine (pid "), line
    assert run(served, "jobs").stderr == ""  # none given: nothing said
    assert "ignored" not in served.stderr()  # --serve --gpus started it: they were used


def test_the_tuis_options_given_to_a_command_are_said_to_be_ignored(served: Served) -> None:
    # --readonly, --no-confirm and --theme shape the TUI only; a command ignored them silently
    done = run(served, "--readonly", "--no-confirm", "--theme", "nord", "jobs", "--json")
    assert done.returncode == 0 and "running" in json.loads(done.stdout)  # JSON untouched
    [line] = done.stderr.splitlines()
    assert line == ("vramtui: warning: --readonly, --no-confirm, --theme ignored: such options "
                    "are the TUI's (`vramtui` with no command) and do nothing for "
                    "`vramtui jobs`"), line
    # abbreviated, and beside an engine's options (each kind its own line)
    done = run(served, "--gpus", "sim:4GiB", "--read", "status", "--json")
    assert done.returncode == 0, done.stderr
    assert [line.split(" ignored: ")[0] for line in done.stderr.splitlines()] == [
        "vramtui: warning: --readonly", "vramtui: warning: --gpus"], done.stderr
    # a command that never attaches says so too; the TUI itself uses them (no terminal here)
    done = run(served, "--theme", "nord", "completion", "bash")
    assert done.returncode == 0 and done.stdout, done.stderr
    assert done.stderr == ("vramtui: warning: --theme ignored: such options are the TUI's "
                           "(`vramtui` with no command) and do nothing for "
                           "`vramtui completion`\n"), done.stderr
    done = run(served, "--readonly", "--no-confirm", "--theme", "nord")
    assert done.returncode == 2 and "ignored" not in done.stderr, done.stderr


def test_readonly_before_web_is_webs_own() -> None:
    """`vramtui --readonly web` served a dashboard that could change everything (web's own
    --readonly default hid the TUI's), with a warning that it was ignored."""
    from vramtui.cli.parser import parse

    for line in (["--readonly", "web"], ["--read", "web"], ["web", "--readonly"]):
        args = parse(line)[1]
        assert args.tui_flags == () and args.readonly is True, line
    assert parse(["--theme", "nord", "web"])[1].tui_flags == ("--theme",)
    assert parse(["web"])[1].readonly is False
    assert parse(["--readonly", "status"])[1].tui_flags == ("--readonly",)


def test_n_alone_watches_and_jobs_says_it_is_no_count(served: Served) -> None:
    # `-n 2` alone watches, as the README has always said (`--watch / -n 2`); `jobs -n 3`
    # reads like "three jobs", so jobs says on stderr what -n does instead
    import signal

    for command in ("jobs", "status"):
        proc = subprocess.Popen([PYTHON, "-m", "vramtui", command, "-n", "0.2", "--json"],
                                env=served.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            json.loads(proc.stdout.readline()), json.loads(proc.stdout.readline())
        finally:
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert ("-n 0.2 refreshes every 0.2 s" in err) == (command == "jobs"), err
    done = cli(served.env, "jobs", "-n", "0")
    assert done.returncode == 2 and "-n takes between 0.1 and 86400 seconds" in done.stderr
