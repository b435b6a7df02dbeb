"""``vramtui reload``: the engine reads its backend descriptors again and applies what
changed (as SIGHUP to ``--serve`` does); prints what was added, removed, changed and kept."""

from __future__ import annotations

import argparse
import sys

from ..connect import open_client
from ..exits import Exit


def run(args: argparse.Namespace) -> int:
    result = open_client(args).reload()
    if args.json:
        from ..output import jsonable, print_json

        out = jsonable(result)
        assert isinstance(out, dict)
        print_json({**out, "unchanged": result.unchanged})
        return Exit.FAILED if result.errors else Exit.OK
    from supervisor.results import reload_summary

    print(f"reloaded {len(result.files)} file(s): {reload_summary(result)}")
    for name in result.added:
        print(f"  + {name}")
    for name in result.removed:
        print(f"  - {name}")
    for change in result.changed:
        print(f"  ~ {change.backend}: {'; '.join(change.changes)}")
        for note in change.notes:
            print(f"      {note}")
    for line in result.kept:
        print(f"  = {line}")
    for line in result.errors:
        print(f"vramtui: descriptor error: {line}", file=sys.stderr)
    return Exit.FAILED if result.errors else Exit.OK
