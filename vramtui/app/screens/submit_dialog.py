"""`SubmitDialog`: submit a job (backend, payload, priority).  It hands a `SubmitRequest`
to the app's ``send`` (in a thread worker) and closes with the new job's id only once the
engine took it: a refusal (the payload too large, the backend gone, the engine away) is shown
in the dialog, and what was typed stays there to fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from supervisor.snapshot import BackendView
from supervisor.validate import PRIORITY_MAX, PRIORITY_MIN


@dataclass(frozen=True)
class SubmitRequest:
    """The dialog's answer: what to submit (``priority`` None: the backend's)."""

    backend: str
    payload: bytes
    priority: int | None


def priority_problem(raw: str) -> str | None:
    """Why ``raw`` is not a priority (empty: the backend's default), or None."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return f"priority must be a whole number, like 10 or -5 (not {raw[:20]!r})"
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        return f"priority must be between {PRIORITY_MIN} and {PRIORITY_MAX}"
    return None


# What a worker behind each ``api:`` is sent: the request body an OpenAI client would send.
_API_EXAMPLES = {
    "chat": {"messages": [{"role": "user", "content": "Hello"}]},
    "completions": {"prompt": "Once upon a time"},
    "embeddings": {"input": "Hello"},
    "images": {"prompt": "a red bicycle", "size": "256x256"},
    "speech": {"input": "Hello", "voice": "alloy"},
}


def example_payload(b: BackendView | None) -> str:
    """An input that fits the backend: its ``api:`` shape, else what the demo models read."""
    if b is not None:
        for api in b.api:
            if api in _API_EXAMPLES:
                return json.dumps({"model": b.name, **_API_EXAMPLES[api]})
    return '{"steps": 10}'


class SubmitDialog(ModalScreen[tuple[SubmitRequest, str] | None]):
    """Submit a job: backend, payload (sent as UTF-8 bytes), priority.  ``send`` submits a
    request and returns the job's id (it raises the engine's refusal); the dialog closes
    with (the request, the id), or None when cancelled."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="submit_cancel", tooltip="Close the dialog"),
        Binding("ctrl+s", "ok", "Submit", id="submit_ok", tooltip="Submit the job"),
    ]

    def __init__(self, backends: list[BackendView], selected: str | None,
                 send: Callable[[SubmitRequest], str]) -> None:
        super().__init__()
        self.backends = backends
        self.selected = selected
        self.send = send
        self.sending = False

    def compose(self) -> ComposeResult:
        names = [b.name for b in self.backends]
        value = self.selected if self.selected in names else (names[0] if names else None)
        with Vertical(id="dialog", classes="submit"):
            yield Label("Submit a job", id="dialog-title")
            yield Label("Backend", classes="field")
            yield Select([(f"{b.name}  ({b.state})", b.name) for b in self.backends],
                         value=value if value is not None else Select.NULL,
                         allow_blank=False, id="backend", compact=True)
            yield Label("Payload (UTF-8; an example that fits the backend)", classes="field")
            self._example = example_payload(self._backend(value))
            yield TextArea(self._example, id="payload", compact=True,
                           soft_wrap=True, show_line_numbers=False)
            yield Label("Priority (empty: the backend's)", classes="field")
            yield Input(placeholder=self._default_priority(value), id="priority",
                        compact=True)
            yield Static("", id="dialog-error", markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button("Submit (ctrl+s)", variant="primary", id="ok", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def _backend(self, name: str | None) -> BackendView | None:
        return next((b for b in self.backends if b.name == name), None)

    def _default_priority(self, name: str | None) -> str:
        b = self._backend(name)
        return f"default: {b.priority}" if b is not None else "default"

    def on_mount(self) -> None:
        self.query_one("#payload", TextArea).focus()

    @on(Input.Changed, "#priority")
    def _priority_typed(self, event: Input.Changed) -> None:
        problem = priority_problem(event.value)
        self.query_one("#dialog-error", Static).update(problem or "")

    @on(Select.Changed, "#backend")
    def _backend_changed(self, event: Select.Changed) -> None:
        self.query_one("#priority", Input).placeholder = self._default_priority(
            str(event.value))
        payload = self.query_one("#payload", TextArea)
        if payload.text == self._example:  # untouched: the example of the new backend
            self._example = example_payload(self._backend(str(event.value)))
            payload.text = self._example

    def action_cancel(self) -> None:
        self.dismiss(None)  # (a submit on its way still goes: _sent says so)

    def action_ok(self) -> None:
        if self.sending:  # a second ctrl+s while the first is on its way: one job
            return
        backend = self.query_one("#backend", Select).value
        if backend is Select.NULL or not isinstance(backend, str):
            self.query_one("#dialog-error", Static).update("choose a backend")
            return
        raw = self.query_one("#priority", Input).value.strip()
        problem = priority_problem(raw)
        if problem is not None:
            self.query_one("#dialog-error", Static).update(problem)
            self.query_one("#priority", Input).focus()
            return
        priority = int(raw) if raw else None
        try:
            payload = self.query_one("#payload", TextArea).text.encode()
        except UnicodeEncodeError:  # a lone surrogate pasted in
            self.query_one("#dialog-error", Static).update(
                "the payload is not valid text (a lone surrogate): remove it")
            return
        self.sending = True
        self.query_one("#dialog-error", Static).update("submitting…")
        self._send(SubmitRequest(backend, payload, priority))

    @work(thread=True, exclusive=True, group="submit", exit_on_error=False)
    def _send(self, req: SubmitRequest) -> None:
        try:
            job_id = self.send(req)
        except Exception as exc:  # noqa: BLE001 - shown in the dialog, which stays open
            self.app.call_from_thread(self._refused, f"{req.backend}: {exc}")
            return
        self.app.call_from_thread(self._sent, req, job_id)

    def _sent(self, req: SubmitRequest, job_id: str) -> None:
        self.sending = False
        if self.is_mounted:
            self.dismiss((req, job_id))
        else:  # closed (esc) while it was on its way: it went all the same
            self.app.notify(f"Submitted {job_id} to {req.backend}.")

    def _refused(self, why: str) -> None:
        self.sending = False
        if self.is_mounted:
            self.query_one("#dialog-error", Static).update(
                f"not submitted: {why}  (fix it and submit again, or esc)")
        else:
            self.app.notify(f"not submitted: {why}", severity="error", timeout=8)

    @on(Input.Submitted, "#priority")
    def _priority_entered(self) -> None:
        self.action_ok()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self.action_ok()
        else:
            self.dismiss(None)
