"""The control socket's request limit, which a user may change, read in one place; and the
engine's own open-file limit, raised at start.

``VRAMTUI_MAX_REQUEST``: the largest request the control socket takes, as a size (``64MiB``
by default; ``1GiB``, ``512MiB``; a bare number is MiB); a larger one is answered "request
too large" and the connection goes on.  (The queue's depth is ``--max-queue`` /
``VRAMTUI_MAX_QUEUE`` / ``config.yaml``: :func:`vramtui.serve.engine_config`.)

A bad value stops the start with one line naming the variable (exit 2), never silently.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import VramtuiError

DEFAULT_MAX_REQUEST = 64 * 1024 * 1024


class BadLimit(VramtuiError):
    """A limit in the environment that cannot be used."""


@dataclass(frozen=True)
class Limits:
    max_request: int = DEFAULT_MAX_REQUEST  # bytes

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Limits:
        request = environ.get("VRAMTUI_MAX_REQUEST", "").strip()
        max_request = DEFAULT_MAX_REQUEST
        if request:
            from .units import parse_size

            try:
                mib = parse_size(request)  # a bare number is MiB, as in descriptors
            except ValueError as exc:
                raise BadLimit(f"VRAMTUI_MAX_REQUEST={request!r}: {exc}") from None
            if not 1 <= mib <= 4096:
                raise BadLimit(f"VRAMTUI_MAX_REQUEST={request!r}: give a size between 1MiB "
                               "and 4GiB (default 64MiB)")
            max_request = mib * 1024 * 1024
        return cls(max_request)


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (the engine holds a
    descriptor per worker socket, log, HTTP and control connection; the common soft limit of
    1,024 is a few hundred connections from running out).  Returns the limit now in force."""
    try:
        import resource
    except ImportError:  # not on this platform
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft
    if soft == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logging.getLogger("supervisor").warning(
            "cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
        return soft
    return hard
