"""`Line`: one line of rich text that repaints without a layout pass."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class Line(Widget):
    """One line of rich text that repaints without a layout pass (unlike Static.update)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.text = Text("")

    def set(self, text: Text) -> None:
        self.text = text
        self.refresh()

    def render(self) -> Text:
        return self.text
