"""vramtui.exits: the one list of exit codes, as ``--help`` prints it and the README lists it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor import errors as E
from supervisor.control import errors as CE
from vramtui.exits import CODES, EXIT_CODES, Exit, exit_code

README = Path(__file__).resolve().parents[1] / "README.md"

# What ``vramtui --help`` has always printed; scripts read it.
HELP = """\
exit codes:
  0   success
  1   the job failed, was cancelled or timed out; doctor found a problem; the engine failed;
      a calibration failed or earned too low a confidence to write an overlay
  2   bad usage or input (unknown flag, bad JSON, unreadable file, request too large)
  3   no engine is running (start one with `vramtui --serve`, or run `vramtui`)
  4   unknown backend, job or GPU
  5   refused: too large for every GPU, queue full, backend failed or busy, access denied,
      or (--serve) another engine already runs in this runtime or state directory
  6   the job has not finished yet (result without --wait)
  7   nothing to do: the job had already ended (cancel); the backend is not loaded (evict,
      sleep, wake), asleep already (sleep) or awake (wake); the GPU is not yielded (resume)
  70  internal error (a bug; VRAMTUI_DEBUG=1 shows the traceback)
  130 interrupted (Ctrl-C; a submitted job goes on, a calibration is cancelled);
      Ctrl-C ends a follow (events, logs -f, status --watch) with 0
"""


def test_the_help_text_is_unchanged() -> None:
    assert EXIT_CODES == HELP


def test_every_named_code_is_listed_once() -> None:
    named = {value for key, value in vars(Exit).items() if key.isupper()}
    listed = [code for code, _meaning in CODES]
    assert sorted(listed) == sorted(set(listed)) == sorted(named)


def test_the_readme_lists_the_same_codes() -> None:
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", README.read_text(), re.M)
    assert [(int(code), meaning) for code, meaning in rows] == [
        (code, " ".join(lines)) for code, lines in CODES]


def test_the_command_and_every_subcommand_print_the_list() -> None:
    from vramtui.cli.parser import build_parser
    from vramtui.cli.registry import COMMANDS

    assert EXIT_CODES in build_parser().format_help()
    for name in COMMANDS:
        parser = build_parser(name)
        sub = parser._subparsers._group_actions[0].choices[name]  # type: ignore[union-attr]
        assert EXIT_CODES in sub.format_help(), name


@pytest.mark.parametrize(("error", "code"), [
    (E.UnknownBackend("x", ()), Exit.NOT_FOUND),
    (E.UnknownJob("j-1"), Exit.NOT_FOUND),
    (E.NoReport("none"), Exit.NOT_FOUND),
    (E.Refused("too large"), Exit.REFUSED),
    (E.NothingToDo("not yielded"), Exit.NOTHING_TO_DO),
    (E.QueueFull("full"), Exit.REFUSED),
    (E.BackendFailed("failed"), Exit.REFUSED),
    (CE.AccessDenied("no"), Exit.REFUSED),
    (CE.UntrustedEngine("no"), Exit.REFUSED),
    (CE.TooManyConnections("busy"), Exit.REFUSED),
    (E.EngineStopped("gone"), Exit.NO_ENGINE),
    (CE.EngineNotRunning("gone"), Exit.NO_ENGINE),
    (CE.RequestTooLarge("big"), Exit.USAGE),
    (CE.BadRequest("bad"), Exit.USAGE),
    (E.InvalidRequest("bad"), Exit.USAGE),
    (CE.ProtocolMismatch("old"), Exit.USAGE),
    (E.JobTimeout("slow"), Exit.JOB_FAILED),
    (E.VramtuiError("other"), Exit.FAILED),
    (RuntimeError("other"), Exit.FAILED),
])
def test_each_error_has_its_code(error: BaseException, code: int) -> None:
    assert exit_code(error) == code


@pytest.mark.process
def test_importing_the_codes_imports_nothing_else() -> None:
    import subprocess
    import sys

    code = ("import sys; before = set(sys.modules); import vramtui.exits; "
            "print(sorted(m for m in set(sys.modules) - before if m != 'vramtui.exits'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "['vramtui']", done.stderr
