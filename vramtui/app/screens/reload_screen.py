"""`ReloadScreen`: what reloading the backend descriptors changed, and each file's errors.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static


class ReloadScreen(ModalScreen[None]):
    """What ``reload`` changed: added, removed, changed (key by key), kept, and the errors
    of each file (those backends kept their previous descriptor)."""

    BINDINGS = [Binding("escape,enter,q", "close", "Close", id="reload_close",
                        tooltip="Close")]

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        from supervisor.results import reload_summary

        r = self.result
        t = Text()
        t.append(f"{len(r.files)} file(s) read: {reload_summary(r)}\n", style="bold")
        for name in r.added:
            t.append(f"+ {name}\n", style="green")
        for name in r.removed:
            t.append(f"- {name}\n", style="#c678dd")
        for change in r.changed:
            t.append(f"~ {change.backend}\n", style="yellow")
            for line in change.changes:
                t.append(f"    {line}\n")
            for note in change.notes:
                t.append(f"    {note}\n", style="dim")
        for line in r.kept:
            t.append(f"= {line}\n", style="yellow")
        if r.errors:
            t.append("\nerrors (fix the file, then reload again):\n", style="bold red")
            for line in r.errors:
                t.append(f"  {line}\n", style="red")
        t.append("\nesc closes", style="dim")
        with VerticalScroll(id="dialog", classes="reload"):
            yield Label("Descriptors reloaded", id="dialog-title")
            yield Static(t, id="dialog-body")

    def action_close(self) -> None:
        self.dismiss(None)
