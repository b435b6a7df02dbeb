"""`HelpScreen`: every key (with what read-only and confirmations make of it), the
colours of the bars and states, and the current modes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .. import fmt
from .dashboard import DASHBOARD_BINDINGS
from .keys import CONFIRMED, MUTATING

if TYPE_CHECKING:
    from ..app import VramApp


class HelpScreen(ModalScreen[None]):
    """Every key (also in the command palette, ctrl+p), the colours, the current modes."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close", id="help_close",
                        tooltip="Close help")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(self._content(), id="help-body")

    def _content(self) -> Group:
        app: VramApp = self.app  # type: ignore[assignment]
        keys = Table(box=None, padding=(0, 1), show_header=True, header_style="bold")
        keys.add_column("Key", style="bold cyan", no_wrap=True)
        keys.add_column("Does")
        keys.add_column("", style="dim", no_wrap=True)
        for b in DASHBOARD_BINDINGS:
            if not b.show:
                continue
            note = ""
            if b.action == "demo" and not app.demo_mode:
                note = "demo backends only"
            elif b.action in MUTATING and app.readonly:
                note = "read-only: off"
            elif b.action in CONFIRMED and app.confirm:
                note = "asks first"
            keys.add_row(b.key_display or b.key, b.tooltip, note)
        for key, does in (("?", "this help"), ("ctrl+p", "command palette: every action, "
                          "each backend and job to act on, and the theme"),
                          ("tab", "the next table (backends, jobs, events or processes)"),
                          ("q", "quit (an embedded engine stops its workers)")):
            keys.add_row(key, does, "")
        nav = Table(box=None, padding=(0, 1), show_header=False)
        nav.add_column(style="bold cyan", no_wrap=True)
        nav.add_column()
        for key, does in (
                ("↑ ↓  k j", "move the selection in the focused table"),
                ("PgUp PgDn", "a page up or down (also ctrl+b, ctrl+f)"),
                ("Home End  g G", "the first or the last row"),
                ("o  O", "sort by the next column; reverse the order (again: back to none)"),
                ("space", "mark a job (c then cancels every marked one; esc clears marks)"),
                ("enter", "open the selected backend, job or process's backend"),
                ("mouse", "click a row to select it, click it again to open it; click a "
                          "column header to sort by it (again: reverse); the wheel scrolls; "
                          "the keys in the footer can be clicked")):
            nav.add_row(key, does)
        detail = Text.assemble(
            ("In a job: ", "bold"), "esc back · c cancel · R retry · + - priority (queued) · "
            "w save the result to a file · b its backend · f follow the log\n",
            ("In a backend: ", "bold"), "esc back · e evict · r respawn · p preload · "
            "m calibrate · s submit · X kill its worker · L reload descriptors · f follow "
            "the log\n",
            ("In a calibration: ", "bold"), "the live chart with its phase bands, then the "
            "results · c cancel the run · w save the report as…\n",
            ("Look: ", "bold"), "ctrl+p → theme, or --theme NAME; NO_COLOR=1 for no colour "
            "(the bars keep distinct characters)")
        bars = Text()
        for char, style, what in (("█", fmt.SEG_OURS, "used by our workers' processes"),
                                  ("▒", fmt.SEG_RESERVED, "reserved by admission, not used"),
                                  ("▓", fmt.SEG_OVER, "used beyond the reservation"),
                                  ("▞", fmt.SEG_FOREIGN, "used by processes not ours"),
                                  ("░", fmt.SEG_FREE, "free"),
                                  ("╌", "yellow", "graph: the budget line (total - reserve)")):
            bars.append(f" {char} ", style=style)
            bars.append(what + "\n")
        states = Text(" backends: ")
        for s, st in fmt.BACKEND_STATE_STYLE.items():
            states.append(s, style=st)
            states.append(" ")
        states.append("\n jobs:     ")
        for s, st in fmt.JOB_STATE_STYLE.items():
            states.append(s, style=st)
            states.append(" ")
        mode = Text.assemble(
            ("Engine: ", "bold"), app.mode,
            ("   Read-only" if app.readonly else "", "bold blue"),
            ("   Confirmations " + ("on" if app.confirm else "off (--no-confirm)"), ""))
        sim = Text.assemble((" SIMULATED ", fmt.SIM_BADGE),
                            " marks a simulated GPU: its memory figures come from simulated "
                            "workers, not from a driver.")
        return Group(Text("vramtui — keys", style="bold"), keys, Text(""),
                     Text("Tables", style="bold"), nav, Text(""), detail, Text(""),
                     Text("Memory bars", style="bold"), bars,
                     Text("States", style="bold"), states, Text(""), sim, Text(""), mode,
                     Text("esc closes", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)

    def on_click(self, event: events.Click) -> None:
        if event.widget is self:  # a click outside the help box closes it
            self.dismiss(None)
