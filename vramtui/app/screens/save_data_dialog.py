"""`SaveDataDialog`: a path for bytes the API handed over (a job's result, a calibration
report), written there atomically by `write_copy`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from .. import fmt


class SaveDataDialog(ModalScreen[Path | None]):
    """A path for bytes the API handed over (a job's result, a calibration report): written
    here, atomically (a temporary file in the target's directory, then a rename)."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="save_cancel", tooltip="Close the dialog"),
    ]

    def __init__(self, title: str, what: Text | str, name: str, data: bytes) -> None:
        super().__init__()
        self.title_text = title
        self.what = what
        self.name_default = name
        self.data = data

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="save"):
            yield Label(self.title_text, id="dialog-title", markup=False)
            yield Static(Text.assemble(
                self.what if isinstance(self.what, Text) else Text(self.what),
                (f"\n{len(self.data)} bytes.  A relative path is taken from ", "dim"),
                fmt.short_path(os.getcwd()), ("; a directory keeps the name.", "dim")),
                id="dialog-body")
            yield Input(value=self.name_default, id="save-path", compact=True)
            yield Static("", id="dialog-error", markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button("Save (enter)", variant="primary", id="ok", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#save-path", Input).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted, "#save-path")
    def _entered(self) -> None:
        self._save()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self._save()
        else:
            self.dismiss(None)

    def _save(self) -> None:
        target = self.query_one("#save-path", Input).value.strip()
        if not target:
            self.query_one("#dialog-error", Static).update("type a path")
            return
        self._write(target)

    @work(thread=True, exclusive=True, group="save-data")
    def _write(self, target: str) -> None:
        try:
            path = write_copy(self.data, target, self.name_default)
        except OSError as exc:
            self.app.call_from_thread(self._failed, exc)
            return
        self.app.call_from_thread(self.dismiss, path)

    def _failed(self, exc: OSError) -> None:
        if self.is_mounted:
            self.query_one("#dialog-error", Static).update(
                f"cannot save there: {exc.strerror or exc}"
                + (f" ({exc.filename})" if getattr(exc, "filename", None) else ""))


def write_copy(data: bytes, target: str | os.PathLike[str], name: str) -> Path:
    """Write ``data`` to ``target`` (a directory: ``name`` in it) atomically: never half a
    file, and an existing one is replaced only once the new one is complete.  A link is
    followed (the file it names is replaced, the link stays); a device, pipe or socket is
    refused, never replaced by a file (as root, ``/dev/null`` would have become one)."""
    from supervisor.atomicfile import write_atomic

    raw = os.fspath(target)
    if "\0" in raw:
        raise OSError(errno.EINVAL, "a path cannot hold a NUL character")
    dest = Path(os.path.expanduser(raw))
    if dest.is_dir():
        dest = dest / name
    dest = Path(os.path.realpath(dest.absolute()))
    if not dest.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such directory", str(dest.parent))
    try:
        kind = dest.stat().st_mode
    except FileNotFoundError:
        kind = None
    if kind is not None and not stat.S_ISREG(kind):
        raise OSError(errno.EINVAL, "not a regular file (a device, pipe or socket); give "
                      "the path of a file or a directory", str(dest))
    return write_atomic(dest, data, mode=0o644)
