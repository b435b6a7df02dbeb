"""``vramtui import-vramd [FILE]``: a vramd descriptor file in vramtui's own spelling.

vramtui runs vramd files as they are (``--backends FILE``, or a ``version: 2`` file in
``backends.d``); this is for moving them over for good. FILE may be a folder (its ``*.yaml``
and ``*.yml`` in name order, as vramd reads its backends.d). Without FILE, the files vramd itself
reads are converted ($VRAMD_BACKENDS_FILE, then $VRAMD_BACKENDS_DIR or
~/.config/vramd/backends.d). The result goes to stdout, or with ``--out`` to a file written
whole or not at all (an existing one is replaced only with ``--force``). Each vramd key that
vramtui cannot honour is named in a warning on stderr (and as a comment in the result); a
backend that cannot be converted is named with the reason, and then nothing is written.

Exit codes: 0 converted; 2 bad input (no file, a descriptor error, an existing --out).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..exits import Exit, UsageError


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", metavar="FILE",
                        help="the vramd file, or a folder of them like vramd's backends.d "
                             "(default: the files vramd reads: "
                             "$VRAMD_BACKENDS_FILE, then $VRAMD_BACKENDS_DIR or "
                             "~/.config/vramd/backends.d)")
    parser.add_argument("--out", "-o", metavar="PATH",
                        help="write the result to PATH (e.g. ~/.config/vramtui/backends.d/"
                             "from-vramd.yaml) instead of printing it")
    parser.add_argument("--force", action="store_true", help="with --out: replace PATH")


def run(args: argparse.Namespace) -> int:
    from supervisor.atomicfile import write_atomic
    from supervisor.backends.loader import folder_files
    from supervisor.backends.vramd_import import import_vramd, vramd_sources

    from ..output import error

    if args.file is not None:
        paths = [Path(args.file).expanduser()]
        if paths[0].is_dir():
            try:
                paths = folder_files(paths[0])
            except OSError as exc:
                raise UsageError(f"{args.file}: cannot list: {exc.strerror or exc}") from None
            if not paths:
                raise UsageError(f"{args.file}: a folder with no *.yaml or *.yml file in it: "
                                 "name the vramd file")
        elif not paths[0].exists():
            raise UsageError(f"{args.file}: no such file or folder")
        elif not paths[0].is_file():
            raise UsageError(f"{args.file}: not a regular file (a device or a pipe); name the "
                             "vramd file")
    else:
        paths = vramd_sources()
        if not paths:
            raise UsageError("no vramd descriptor found: give FILE, or set "
                             "VRAMD_BACKENDS_FILE")
    out = Path(args.out).expanduser() if args.out else None
    if out is not None and out.exists() and not args.force:
        raise UsageError(f"{out} exists: pass --force to replace it")
    result = import_vramd(paths)
    for warning in result.warnings:
        sys.stderr.write(f"vramtui: warning: {warning}\n")
    for problem in result.errors:
        error(f"not converted: {problem}")
    if args.json:
        sys.stdout.write(json.dumps({
            "backends": list(result.names), "files": [str(f) for f in result.files],
            "warnings": [str(w) for w in result.warnings],
            "errors": [str(e) for e in result.errors], "yaml": result.text,
            "written": str(out) if out is not None and not result.errors else None,
        }) + "\n")
    elif out is None:
        sys.stdout.write(result.text)
    if result.errors:
        if out is not None:
            error(f"nothing written to {out}: fix the backends above first (or convert the "
                  "others by hand)")
        return Exit.USAGE
    if out is not None:
        write_atomic(out, result.text)
        sys.stderr.write(f"wrote {len(result.names)} backend(s) to {out}\n")
    return Exit.OK
