"""The key policy every screen shares: `key_binding` builds a `Binding` whose id is its action,
`MUTATING` lists the actions that change something (off in --readonly, where the
`ReadonlyKeys` mixin says why a key does nothing), `CONFIRMED` those that ask first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual import events
from textual.binding import Binding

if TYPE_CHECKING:
    from ..app import VramApp


def key_binding(key: str, action: str, description: str, tooltip: str, **kw: Any) -> Binding:
    """A key with a tooltip whose id is its action (the name a keymap gives it)."""
    return Binding(key, action, description, tooltip=tooltip, id=action, **kw)


# The actions that change something: not offered in --readonly.
MUTATING = frozenset({"evict", "respawn", "cancel_job", "preload", "zero", "submit",
                      "calibrate", "cancel_this", "demo", "cancel_run", "retry", "kill",
                      "drain", "reload", "priority_up", "priority_down", "retry_this",
                      "sleep_wake", "yield_gpu"})

# The actions that ask first (unless --no-confirm), as the help says.
CONFIRMED = frozenset({"evict", "respawn", "cancel_job", "zero", "calibrate", "kill", "drain",
                       "cancel_this", "yield_gpu"})


class ReadonlyKeys:
    """A screen mixin: in --readonly, the keys that would change something are not in the
    footer, and pressing one says why nothing happens instead of doing nothing silently."""

    def readonly_key(self, event: events.Key) -> None:
        app: VramApp = self.app  # type: ignore[attr-defined]
        if not app.readonly:
            return
        for binding in type(self).BINDINGS:  # type: ignore[attr-defined]
            if isinstance(binding, Binding) and binding.action in MUTATING and \
                    event.key in binding.key.split(","):
                event.stop()
                app.notify(f"Read-only: {binding.description.lower()} is off (vramtui was "
                           "started with --readonly).", severity="warning", timeout=4)
                return
