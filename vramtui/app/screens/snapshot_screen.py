"""`SnapshotScreen`: the base of the full screens; it renders the snapshots the app hands
the top screen (``show_snapshot``) under the engine header.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from textual.css.query import NoMatches
from textual.screen import Screen

from supervisor.snapshot import EngineSnapshot

from ..widgets.engine_header import EngineHeader

if TYPE_CHECKING:
    from ..app import VramApp


class SnapshotScreen(Screen[None]):
    """A screen that renders snapshots; the app calls ``show_snapshot`` only on the top one."""

    @property
    def vapp(self) -> VramApp:
        return self.app  # type: ignore[return-value]

    def header(self) -> EngineHeader:
        return EngineHeader(self.vapp.mode, self.vapp.clocks, id="header")

    def show_snapshot(self, snap: EngineSnapshot | None) -> None:
        self.query_one(EngineHeader).show(snap, self.vapp.gone, self.vapp.readonly)

    def on_screen_resume(self) -> None:
        self.refresh_snapshot()

    def on_resize(self) -> None:
        self.refresh_snapshot()

    def refresh_snapshot(self) -> None:
        """Show the app's latest snapshot now (if this screen's widgets are there yet)."""
        with contextlib.suppress(NoMatches):
            self.show_snapshot(self.vapp.snap)
