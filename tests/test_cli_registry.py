"""vramtui.cli: the parser is built from the registry, every registered command is complete,
the commands never import the CLI back, and a command imports only its own module."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vramtui.cli.parser import build_parser, parse
from vramtui.cli.registry import COMMANDS, REGISTRY, command

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / "vramtui" / "cli"
MAIN = "vramtui.cli"  # the CLI's main module: main() and the dispatch
FRAMEWORK = {"vramtui.cli", "vramtui.cli.parser", "vramtui.cli.registry"}
# `vramtui completion` prints a script generated from the whole parser: it alone may import it.
MAY_IMPORT_THE_PARSER = {"vramtui.cli.completion"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports (at the top or inside a function), as absolute names;
    ``from package import name`` counts as importing ``package`` and ``package.name``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def test_the_import_reader_sees_relative_imports() -> None:
    # the checks below are only as good as this reading of `from ..x import y` and friends
    assert {"vramtui.connect", "vramtui.cli.watch", "vramtui.exits", "supervisor.units"} <= \
        imported(CLI / "status.py")
    assert {"vramtui.cli.parser", "vramtui.cli.registry", "vramtui.exits", "vramtui.serve",
            "vramtui.app"} <= imported(CLI / "__init__.py")
    assert MAIN in imported(ROOT / "vramtui" / "__main__.py")


COMMAND_MODULES = sorted({f"vramtui.cli.{row.module}" for row in REGISTRY})


def test_every_registered_command_has_help_a_handler_and_its_arguments() -> None:
    assert len(set(COMMANDS)) == len(COMMANDS)
    for row in REGISTRY:
        assert row.help.strip(), row.name
        module = importlib.import_module(f"vramtui.cli.{row.module}")
        assert module.__doc__, module.__name__  # each module says what it owns
        assert callable(getattr(module, row.run)), row.name
        if row.arguments is not None:
            assert callable(getattr(module, row.arguments)), row.name
        assert command(row.name) is row


def test_the_whole_parser_has_every_command_in_the_registrys_order() -> None:
    for arguments in (True, False):
        parser = build_parser(arguments=arguments)
        choices = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
        assert list(choices) == list(COMMANDS)
        for row in REGISTRY:
            if arguments:
                assert choices[row.name].description == row.help
    # the listing (no command modules imported) prints the same --help as the whole parser
    assert build_parser(arguments=False).format_help() == build_parser().format_help()


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_parses_on_its_own(name: str) -> None:
    parser = build_parser(name)
    choices = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(choices) == [name]
    sub = choices[name]
    # --json and --attach where they do something (an engine asked, output to read) only
    row = command(name)
    assert {o for o in ("--json", "--attach") if o in sub._option_string_actions} == \
        set(row.common)
    # and every positional argument says what it is
    assert all(a.help for a in sub._actions if not a.option_strings), name


def test_commands_that_ask_no_engine_have_no_attach() -> None:
    """completion and recalibrate (and the importers, install-service) listed --attach and
    --json, where they did nothing."""
    assert command("completion").common == command("install-service").common == ()
    for name in ("recalibrate", "import-vramd", "import-llama-swap"):
        assert command(name).common == ("--json",), name
    assert command("web").common == ("--attach",)
    choices = build_parser("completion")._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    help_text = choices["completion"].format_help()
    assert "--attach" not in help_text and "--json" not in help_text


def test_an_abbreviated_option_still_finds_the_command() -> None:
    # `--att` hides `status` from the quick look: the listing pass finds it
    _parser, args = parse(["--att", "/x.sock", "status", "--json"])
    assert (args.command, args.attach, args.json) == ("status", "/x.sock", True)
    _parser, args = parse(["--readonly"])
    assert args.command is None and args.readonly


def test_no_module_imports_the_clis_main_module() -> None:
    for path in sorted((ROOT / "vramtui").rglob("*.py")):
        name = module_name(path)
        if name in ("vramtui.cli", "vramtui.__main__"):  # the main module; `python -m vramtui`
            continue
        assert MAIN not in imported(path), f"{name} imports {MAIN}"


@pytest.mark.parametrize("name", sorted(
    module_name(p) for p in CLI.glob("*.py") if module_name(p) not in FRAMEWORK))
def test_no_command_module_imports_the_registry_or_the_parser(name: str) -> None:
    path = ROOT / (name.replace(".", "/") + ".py")
    back = imported(path) & FRAMEWORK
    if name in MAY_IMPORT_THE_PARSER:
        back -= {"vramtui.cli.parser"}
    assert not back, f"{name} imports {sorted(back)}"


def test_every_module_of_the_package_is_a_registered_command_or_a_helper() -> None:
    helpers = {"vramtui.cli.watch"}  # --watch / -n, shared by status, queue and jobs
    present = {module_name(p) for p in CLI.glob("*.py")}
    assert present == FRAMEWORK | helpers | set(COMMAND_MODULES)


def loaded_after(code: str) -> list[str]:
    script = (f"import sys; {code}; "
              "print(' '.join(sorted(m for m in sys.modules if m.startswith('vramtui'))))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.process
def test_yield_imports_no_engine(tmp_path: Path) -> None:
    """`vramtui yield 0 --for 1h` imported the whole engine (and yaml) for its one limit."""
    env = {**os.environ, "VRAMTUI_RUNTIME_DIR": str(tmp_path / "run"),
           "VRAMTUI_STATE_DIR": str(tmp_path / "state"),
           "VRAMTUI_CONFIG_DIR": str(tmp_path / "cfg")}
    code = ("import sys; from vramtui.cli import main; rc = main(['yield', '0', '--for', '1h']);"
            "print(rc, [m for m in sys.modules if m.startswith(('supervisor.engine', 'yaml'))])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env)
    assert done.stdout.strip() == "3 []", (done.stdout, done.stderr)  # 3: no engine runs


@pytest.mark.process
def test_importing_the_cli_imports_nothing_yet() -> None:
    assert loaded_after("import vramtui.cli") == ["vramtui", "vramtui.cli"]


@pytest.mark.process
def test_a_command_imports_its_own_module_only() -> None:
    mods = loaded_after("from vramtui.cli.parser import parse; parse(['status', '--json'])")
    assert {m for m in mods if m.startswith("vramtui.cli.")} == {
        "vramtui.cli.parser", "vramtui.cli.registry", "vramtui.cli.status", "vramtui.cli.watch"}
    mods = loaded_after("from vramtui.cli.parser import parse; parse(['--readonly'])")
    assert {m for m in mods if m.startswith("vramtui.cli.")} == {
        "vramtui.cli.parser", "vramtui.cli.registry"}


def test_a_value_that_looks_like_a_negative_number_reaches_its_options_check() -> None:
    # argparse would call "-1s" an unknown option ("expected one argument")
    args = parse(["yield", "0", "--for", "-1s"])[1]
    assert args.duration == "-1s" and args.gpus == [0]
    assert parse(["submit", "echo", "--priority", "-5"])[1].priority == -5
    assert parse(["yield", "--now", "0"])[1].now  # a flag is left as it is
