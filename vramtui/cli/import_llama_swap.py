"""``vramtui import-llama-swap CONFIG [-o DIR]``: llama-swap's config.yaml as our descriptors.

vramtui runs a llama-swap file as it is (``--backends config.yaml``); this is for moving it
over for good: one descriptor file per model, ``DIR/NAME.yaml`` (default: the user's
``backends.d``), all written whole or none at all (a folder that cannot be written is one
line, exit 2).  Nothing is written when one of them
exists already, unless ``--force``.  Each thing llama-swap's file says that vramtui does not
use is one line on stderr (and a comment in the model's file); a model that cannot be
converted is named with the reason, and then nothing is written.

Exit codes: 0 converted; 2 bad input (no file, a model that cannot be read, a file in the way).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..exits import Exit, UsageError


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="CONFIG", help="llama-swap's config.yaml")
    parser.add_argument("--out", "-o", metavar="DIR",
                        help="where to write NAME.yaml for each model (default: "
                             "~/.config/vramtui/backends.d)")
    parser.add_argument("--force", action="store_true",
                        help="replace descriptor files that exist already")


def run(args: argparse.Namespace) -> int:
    from supervisor.atomicfile import write_all_atomic
    from supervisor.backends.errors import DescriptorError
    from supervisor.backends.llama_swap import is_llama_swap
    from supervisor.backends.llama_swap_import import import_llama_swap
    from supervisor.backends.yamlio import load_documents
    from supervisor.paths import Paths, backends_dir_of

    from ..output import error

    path = Path(args.file).expanduser()
    try:
        documents = load_documents(path)  # says: no such file, is a directory, bad YAML …
    except DescriptorError as exc:
        raise UsageError(str(exc)) from None
    if len(documents) != 1 or not is_llama_swap(documents[0]):
        raise UsageError(f"{args.file}: not a llama-swap config (a mapping with 'models:' by "
                         "model ID)")
    read_at_start = backends_dir_of(Paths.from_env().config_dir)
    out = Path(args.out).expanduser() if args.out else read_at_start
    result = import_llama_swap(path)
    for warning in result.warnings:
        sys.stderr.write(f"vramtui: note: {warning}\n")
    for problem in result.errors:
        error(f"not converted: {problem}")
    targets = [out / name for name in result.files]
    in_the_way = [t for t in targets if t.exists()]
    written: list[str] = []
    if not result.errors and not (in_the_way and not args.force):
        try:
            write_all_atomic({target: result.files[target.name] for target in targets})
        except OSError as exc:
            where = exc.filename or out
            raise UsageError(f"nothing written: {where}: {exc.strerror or exc}") from None
        written = [str(target) for target in targets]
    if args.json:
        sys.stdout.write(json.dumps({
            "backends": list(result.names), "warnings": [str(w) for w in result.warnings],
            "errors": [str(e) for e in result.errors], "written": written}) + "\n")
    if result.errors:
        error(f"nothing written to {out}: fix the models above first")
        return Exit.USAGE
    if in_the_way and not args.force:
        raise UsageError(f"{', '.join(str(t) for t in in_the_way)} exist(s) already: pass "
                         "--force to replace, or -o another folder")
    if not args.json:
        for target in written:
            sys.stdout.write(f"wrote {target}\n")
        how = ("vramtui reads them at start (or `vramtui reload`)"
               if out.resolve() == read_at_start.resolve() else
               f"vramtui reads them with `--backends {out}` (or move them to {read_at_start})")
        sys.stderr.write(f"{len(written)} backend(s) written to {out}; {how}\n")
    return Exit.OK
