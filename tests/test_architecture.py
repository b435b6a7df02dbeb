"""docs/ARCHITECTURE.md is true: the modules it names exist, its state tables are the code's,
and the arrows between the packages point one way."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from supervisor.jobs import states as job_states
from supervisor.workers import states as worker_states

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
NAMED = re.compile(r"`((?:supervisor|vramtui|worker_sdk|tests|bench|docs)/[\w/.]*)`")
DOORS = ("supervisor/doors/", "supervisor/control/", "supervisor/http/", "supervisor/facade.py",
         "supervisor/client.py", "supervisor/operations.py", "supervisor/api.py",
         "supervisor/apispec.py")
FRONT = "supervisor/__init__.py"  # the package's own front: it names the facade


def test_every_module_the_map_names_exists() -> None:
    named = sorted(set(NAMED.findall(DOC.read_text())))
    assert len(named) > 40, named  # the map names the house, not a few rooms
    missing = [name for name in named if not (ROOT / name.rstrip("/")).exists()]
    assert missing == [], f"docs/ARCHITECTURE.md names what does not exist: {missing}"


def _table(after: str) -> dict[str, set[str]]:
    """The ``| from | to |`` table that follows the line starting with ``after``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    rows: dict[str, set[str]] = {}
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ("from", "---"):
            continue
        rows[cells[0]] = set() if cells[1] == "—" else {c.strip() for c in cells[1].split(",")}
    return rows


@pytest.mark.parametrize("heading,table", [
    ("A job (", job_states.TRANSITIONS), ("A worker process (", worker_states.TRANSITIONS)])
def test_the_maps_state_tables_are_the_codes(heading: str, table: object) -> None:
    code = {s.value: {t.value for t in moves} for s, moves in table.items()}  # type: ignore[attr-defined]
    assert _table(heading) == code


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports, absolute (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def _files(prefix: str) -> list[Path]:
    return sorted(p for p in ROOT.glob(f"{prefix}/**/*.py"))


def _as_path(module: str) -> str:
    return module.replace(".", "/")


def test_no_arrow_points_up() -> None:
    problems = []
    for path in _files("worker_sdk"):
        for module in _imports(path):
            if module.startswith(("supervisor", "vramtui")):
                problems.append(f"{path.relative_to(ROOT)} imports {module}")
    for path in _files("supervisor"):
        rel = path.relative_to(ROOT).as_posix()
        for module in _imports(path):
            if module.startswith("vramtui"):
                problems.append(f"{rel} imports {module}")
            is_door = rel.startswith(DOORS) or rel == FRONT
            target = _as_path(module)
            if not is_door and module.startswith("supervisor") and any(
                    target.startswith(d.removesuffix(".py").rstrip("/")) for d in DOORS):
                problems.append(f"{rel} (the engine) imports the door {module}")
    assert problems == [], "\n".join(problems)
