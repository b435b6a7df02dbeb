"""The check every importer makes of what it converted: our own loader must read the files it
writes back into exactly the backends it meant (else the importer has a bug, said as one)."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from .loader import load_backends


def check_round_trip(files: Mapping[str, str], expected: Mapping[str, Any],
                     environ: Mapping[str, str]) -> None:
    """Write ``files`` (name -> text) to a scratch directory and load it: RuntimeError unless
    it gives ``expected`` (where each backend came from aside)."""
    with tempfile.TemporaryDirectory(prefix="vramtui-import-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        back = load_backends([tmp], environ=environ, demo_fallback=False)
    got = {name: replace(spec, source="") for name, spec in back.backends.items()}
    want = {name: replace(spec, source="") for name, spec in expected.items()}
    if back.errors or got != want:
        problems = "; ".join(str(e) for e in back.errors) or ", ".join(
            sorted(n for n in set(got) | set(want) if got.get(n) != want.get(n)))
        raise RuntimeError(f"the converted descriptors do not load back the same: {problems}")
