"""`KeyFooter`: the footer of the full screens, showing the keys that fit its width, most
wanted first (the rest stay in the help and the command palette).
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey


class KeyFooter(Footer):
    """The footer, showing the keys that fit its width, most wanted first.

    Each key has a rank (``RANK``; unlisted: 5); keys are kept in rank order while their
    total width fits, and the rest are hidden (they stay in the help and the palette), so the
    footer never runs off the edge at 60, 80 or 120 columns.
    """

    RANK = {"help": 0, "quit": 0, "back": 0, "details": 1, "evict": 2, "cancel_job": 1,
            "submit": 2, "filter": 3, "respawn": 3, "cancel_this": 1, "follow": 3,
            "demo": 2, "cancel_run": 1, "save": 2, "retry": 3, "kill": 4, "preload": 4,
            "calibrate": 4, "reload": 5, "drain": 6, "zero": 6, "priority_up": 6,
            "priority_down": 7, "graph_window": 7, "processes": 5, "backend": 4,
            "save_result": 4, "yield_gpu": 7}
    PALETTE = 12  # the command palette's key on the right

    def compose(self) -> ComposeResult:
        widgets = list(super().compose())
        self._fit(widgets)
        yield from widgets

    def on_resize(self) -> None:
        self._fit(list(self.query(FooterKey)))

    def _fit(self, widgets: list[Any]) -> None:
        width = self.size.width
        keys = [w for w in widgets if isinstance(w, FooterKey)
                and not w.has_class("-command-palette")]
        if width <= 0:
            return
        room = width - self.PALETTE
        order = sorted(keys, key=lambda w: (self.RANK.get(w.action, 5), keys.index(w)))
        used, shown = 0, set()
        for w in order:
            need = len(w.key_display or w.key) + len(w.description) + 3
            if used + need <= room:
                used += need
                shown.add(id(w))
        for w in keys:
            w.display = id(w) in shown
