"""`titles`: set a widget's border title and subtitle, repainting only on a change."""

from __future__ import annotations

from textual.widget import Widget


def titles(widget: Widget, title: str | None = None, subtitle: str | None = None) -> None:
    """Set border titles only when they change (each assignment repaints the whole widget)."""
    last: dict[str, str] = widget.__dict__.setdefault("_vt_titles", {})
    if title is not None and last.get("title") != title:
        widget.border_title = last["title"] = title
    if subtitle is not None and last.get("subtitle") != subtitle:
        widget.border_subtitle = last["subtitle"] = subtitle
