"""`titles`: set a widget's border title and subtitle, repainting only on a change."""

from __future__ import annotations

from textual.content import Content
from textual.widget import Widget


def titles(widget: Widget, title: str | Content | None = None,
           subtitle: str | Content | None = None) -> None:
    """Set border titles only when they change (each assignment repaints the whole widget).

    A ``str`` is markup, for the app's own words; what the engine or the user said goes in
    as ``Content`` (``Content.assemble``), where a ``[/]`` in it is text, not a tag."""
    last: dict[str, str | Content] = widget.__dict__.setdefault("_vt_titles", {})
    if title is not None and last.get("title") != title:
        widget.border_title = last["title"] = title
    if subtitle is not None and last.get("subtitle") != subtitle:
        widget.border_subtitle = last["subtitle"] = subtitle
