"""`ConfirmDialog`: yes or no before a destructive command (off with --no-confirm).
"""

from __future__ import annotations

from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static


class ConfirmDialog(ModalScreen[bool]):
    """Yes or no, for destructive commands (turn off with --no-confirm)."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="yes", tooltip="Do it"),
        Binding("n,escape", "answer(False)", "No", id="no", tooltip="Leave it"),
    ]

    def __init__(self, title: str, body: str, *,
                 live: Callable[[], str] | None = None) -> None:
        """``live``: the body, read again twice a second while the dialog is open."""
        super().__init__()
        self.title_text = title
        self.body = body
        self.live = live

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="confirm"):
            yield Label(self.title_text, id="dialog-title", markup=False)
            yield Static(self.body, id="dialog-body", markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button("Yes (y)", variant="error", id="yes", compact=True)
                yield Button("No (n)", id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()
        if self.live is not None:
            self.set_interval(0.5, self._reread)

    def _reread(self) -> None:
        assert self.live is not None
        body = self.live()
        if body != self.body:
            self.body = body
            self.query_one("#dialog-body", Static).update(body)

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")
