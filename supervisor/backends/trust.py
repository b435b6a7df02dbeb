"""Whether a descriptor file may be trusted: a descriptor says which commands the engine runs.

Whoever can write a descriptor runs commands as the engine's user (a backend's ``command``, a
llama-swap ``cmd`` preloaded at start).  As ssh does with its own files, a descriptor is read
only when no one else can have written it: the file belongs to the engine's user or to root,
and neither group nor others may write it; its directory likewise, unless it is sticky (as
``/tmp`` is: others may add files there, but not replace ours, and theirs fail the first
check).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..paths import user_name


def untrusted(file: Path, uid: int | None = None) -> str | None:
    """Why ``file`` cannot be trusted as a descriptor, or None when it can."""
    me = os.geteuid() if uid is None else uid
    for path, what in ((file, "it"), (file.parent, "its directory")):
        try:
            st = path.stat()
        except OSError:
            return None  # reading it says what is wrong
        owner_ok = st.st_uid in (me, 0)
        writable = stat.S_IMODE(st.st_mode) & 0o022
        if what != "it" and st.st_mode & stat.S_ISVTX:
            writable = 0
        if not owner_ok:
            return (f"{what} belongs to {user_name(st.st_uid)}: whoever writes a descriptor "
                    "runs commands as you; copy it to a file of yours, or chown it")
        if writable:
            return (f"{what} may be written by {'others' if writable & 0o002 else 'its group'} "
                    f"(mode {stat.S_IMODE(st.st_mode):04o}): whoever writes a descriptor runs "
                    f"commands as you; chmod go-w {path}")
    return None
