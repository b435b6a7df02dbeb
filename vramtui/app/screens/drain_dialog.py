"""`DrainDialog`: drain a GPU, or open a draining one again (and, with its texts given,
yield a GPU or resume a yielded one: the same choice of one GPU to flip).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static


class DrainDialog(ModalScreen[tuple[int, bool] | None]):
    """Drain a GPU or open it again: one line per GPU; its number (or enter on it) toggles."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="drain_cancel", tooltip="Close")]

    def __init__(self, gpus: list[tuple[int, str, bool]], title: str = "Drain a GPU",
                 body: str = "A draining GPU finishes its running work and admits nothing "
                 "new; queued work goes to the other GPUs or waits.  Choose one to drain "
                 "(or to open again):",
                 states: tuple[str, str] = ("admitting: drain it",
                                            "DRAINING: open it again")) -> None:
        super().__init__()
        self.gpus = gpus  # (index, name, draining)
        self.title_text, self.body, self.states = title, body, states

    def compose(self) -> ComposeResult:
        from textual.widgets import OptionList

        with Vertical(id="dialog", classes="drain"):
            yield Label(self.title_text, id="dialog-title", markup=False)
            yield Static(self.body, id="dialog-body", markup=False)
            yield OptionList(*[Text(f"GPU{i} · {name} · " + self.states[d])
                               for i, name, d in self.gpus], id="drain-gpus")

    def on_key(self, event: events.Key) -> None:
        if event.character and event.character.isdigit():
            for i, _name, d in self.gpus:
                if str(i) == event.character:
                    event.stop()
                    self.dismiss((i, not d))

    def on_option_list_option_selected(self, event: Any) -> None:
        i, _name, draining = self.gpus[event.option_index]
        self.dismiss((i, not draining))

    def action_cancel(self) -> None:
        self.dismiss(None)
