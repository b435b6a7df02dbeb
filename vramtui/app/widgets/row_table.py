"""`RowTable`: a lean, keyed table for live data (the dashboard's backends and jobs).

Textual's DataTable re-renders every visible cell whenever any cell changes (its caches are
keyed on a global update count); at 4 snapshots a second that was most of the dashboard's CPU.
This table renders each row once into a Strip, caches it by the row's cells, and repaints only
the lines that changed.  It keeps what the dashboard needs: a fixed header, a row cursor that
stays on its key when rows move, keyboard and mouse (click to select, click again or enter to
open), and vertical scrolling.  Also what users of htop and k9s reach for: ``j``/``k`` and
the arrows, ``g``/``G`` and Home/End, PgUp/PgDn; ``o`` sorts by the next column (``O``
reverses; a click on a column's header sorts by it); marks (``space``) for acting on several
rows at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

Cell = str | Text


@dataclass(frozen=True)
class Col:
    key: str
    label: str
    width: int | None  # None: the rest of the width (the last column)
    narrow: bool = True  # shown in narrow terminals
    narrow_width: int | None = None

    def width_for(self, narrow: bool) -> int | None:
        return self.narrow_width if narrow and self.narrow_width else self.width


class RowTable(ScrollView, can_focus=True):
    """Rows keyed by strings; ``sync(rows)`` makes the table show exactly those rows."""

    COMPONENT_CLASSES = {"rowtable--header", "rowtable--cursor", "rowtable--cursor-blurred"}
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup,ctrl+b", "page(-1)", "Page up", show=False),
        Binding("pagedown,ctrl+f", "page(1)", "Page down", show=False),
        Binding("home,g", "edge(0)", "First", show=False),
        Binding("end,G", "edge(1)", "Last", show=False),
        Binding("enter", "select", "Details", show=False),
        Binding("o", "sort(1)", "Sort", show=False, id="sort",
                tooltip="Sort by the next column (again: the one after; O reverses)"),
        Binding("O", "sort(0)", "Reverse sort", show=False, id="sort_reverse"),
    ]
    MARKS = False  # rows can be marked with space (the jobs table)
    # The cursor follows its row's key; when that key leaves the table: True, nothing is
    # selected until the cursor moves (never another row in its place: the jobs table).
    LOSES_SELECTION = False
    COLUMNS: tuple[Col, ...] = ()
    PADDING = 1

    class Selected(Message):
        """A row was chosen (enter, or a click on the highlighted row)."""

        def __init__(self, table: RowTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> RowTable:
            return self.table

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.narrow = False
        self.cursor_row = 0
        self._cols: tuple[Col, ...] = ()
        self._labels: dict[str, str] = {}
        self._colsig: object = None
        self._order: list[str] = []
        self._index: dict[str, int] = {}
        self._cells: dict[str, tuple[Cell, ...]] = {}
        self._strips: dict[str, tuple[object, Strip]] = {}
        self._header: tuple[object, Strip] | None = None
        self._memo: dict[str, tuple[object, dict[str, object]]] = {}
        self._given: dict[str, dict[str, object]] = {}
        self.renders = 0
        self.sort_by: str | None = None  # a column key (None: the order given)
        self.sort_reverse = False
        self.marked: set[str] = set()
        self.lost = False  # LOSES_SELECTION: the selected row went away
        # The selected key while the rows are handed again (new columns, a new sort order):
        # the next sync selects it again, wherever it lands.
        self._reselect: str | None = None

    def memo(self, key: str, sig: object, build: Callable[[], dict[str, object]]
             ) -> dict[str, object]:
        """The row ``build()`` made the last time ``sig`` was the same (rows are rebuilt only
        when what they show changed)."""
        hit = self._memo.get(key)
        if hit is not None and hit[0] == sig:
            return hit[1]
        row = build()
        self._memo[key] = (sig, row)
        return row

    # -------------------------------------------------------------------------- data ---
    def set_columns(self, narrow: bool, labels: dict[str, str] | None = None) -> None:
        cols = tuple(c for c in self.COLUMNS if c.narrow or not narrow)
        labels = labels or {}
        sig = (cols, narrow, tuple(sorted(labels.items())))
        if sig == self._colsig:
            return
        self._colsig = sig
        self._reselect = self.selected_key() or self._reselect
        self._cols, self.narrow, self._labels = cols, narrow, labels
        self._order, self._index, self._cells = [], {}, {}
        self._memo.clear()
        self._given.clear()
        self._strips.clear()
        self._header = None
        self.refresh()

    @property
    def row_count(self) -> int:
        return len(self._order)

    def keys(self) -> list[str]:
        return list(self._order)

    def get_row_index(self, key: str) -> int:
        return self._index[key]

    def get_cell(self, key: str, column: str) -> Cell:
        i = next(i for i, c in enumerate(self._cols) if c.key == column)
        return self._cells[key][i]

    def selected_key(self) -> str | None:
        if not self._order or self.lost:
            return None
        return self._order[min(self.cursor_row, len(self._order) - 1)]

    def column_width(self, key: str) -> int:
        """The cells a column has now (0 when it is not shown)."""
        col = next((c for c in self._cols if c.key == key), None)
        if col is None:
            return 0
        return col.width_for(self.narrow) or self.last_width()

    def last_width(self) -> int:
        """Room for the last (free-width) column, so that rows never overflow."""
        fixed = sum((c.width_for(self.narrow) or 0) + 2 * self.PADDING for c in self._cols[:-1])
        return max(8, self.scrollable_content_region.width - fixed - 2 * self.PADDING)

    def sync(self, rows: list[tuple[str, dict[str, object]]]) -> None:
        """Show exactly ``rows`` (key, {column: cell}) in this order; repaint what changed."""
        keep = self.selected_key() or self._reselect
        self._reselect = None
        if self.sort_by is not None and any(c.key == self.sort_by for c in self._cols):
            col = self.sort_by
            rows = sorted(rows, key=lambda r: natural_key(r[1].get(col, "")),
                          reverse=self.sort_reverse)
        self.marked &= {k for k, _ in rows}
        order = [k for k, _ in rows]
        given = self._given
        cells = {k: self._cells[k] if given.get(k) is v and k in self._cells
                 else tuple(v.get(c.key, "") for c in self._cols)  # type: ignore[misc]
                 for k, v in rows}
        self._given = dict(rows)
        if order != self._order:
            for gone in set(self._memo) - set(cells):
                del self._memo[gone]
            self._order = order
            self._index = {k: i for i, k in enumerate(order)}
            self._cells = cells
            for gone in set(self._strips) - set(cells):
                del self._strips[gone]
            self.virtual_size = Size(self.virtual_size.width, len(order) + 1)
            if keep in self._index:
                self.cursor_row = self._index[keep]
            elif keep is not None and self.LOSES_SELECTION:
                self.lost = True
            self.cursor_row = max(0, min(self.cursor_row, len(order) - 1))
            self.refresh()
            return
        top = int(self.scroll_y)
        bottom = top + self.size.height  # rows out of sight are painted when scrolled to
        for k in order:
            if cells[k] is not self._cells.get(k) and cells[k] != self._cells.get(k):
                self._cells[k] = cells[k]
                if top <= self._index[k] <= bottom:
                    self._refresh_row(self._index[k])

    # ------------------------------------------------------------------------ cursor ---
    def move_cursor(self, row: int) -> None:
        if not self._order:
            return
        old, was_lost = self.cursor_row, self.lost
        if self.lost:
            self.lost = False
            self._refresh_row(self.cursor_row)
        self.cursor_row = max(0, min(row, len(self._order) - 1))
        if old != self.cursor_row:
            self._refresh_row(old)
            self._refresh_row(self.cursor_row)
        if old != self.cursor_row or was_lost:
            self.post_message(self.Moved(self))
        self._scroll_to_cursor()

    class Moved(Message):
        """The cursor moved to another row (what the selection shows elsewhere follows)."""

        def __init__(self, table: RowTable) -> None:
            super().__init__()
            self.table = table

        @property
        def control(self) -> RowTable:
            return self.table

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.scrollable_content_region.height - 1)
        top = int(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False)

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(1, self.size.height - 2))

    def action_edge(self, end: int) -> None:
        self.move_cursor(len(self._order) - 1 if end else 0)

    def action_sort(self, step: int) -> None:
        """``o``: sort by the next column (from none, the first); ``O``: reverse the order."""
        keys = [c.key for c in self._cols]
        if not step:
            if self.sort_by is None and keys:
                self.sort_by = keys[0]
            self.sort_reverse = not self.sort_reverse
        elif self.sort_by is None or self.sort_by not in keys:
            self.sort_by, self.sort_reverse = (keys[0] if keys else None), False
        else:
            i = keys.index(self.sort_by) + 1
            self.sort_by, self.sort_reverse = (keys[i] if i < len(keys) else None), False
        self._resorted()

    def sort_on(self, key: str | None, reverse: bool = False) -> None:
        self.sort_by, self.sort_reverse = key, reverse
        self._resorted()

    def _resorted(self) -> None:
        self._header = None
        self._reselect = self.selected_key() or self._reselect
        self._order = []  # the next sync reorders and repaints
        self.post_message(self.Resorted(self))
        self.refresh()

    class Resorted(Message):
        """The sort order changed: the screen should hand the rows again."""

        def __init__(self, table: RowTable) -> None:
            super().__init__()
            self.table = table

    def action_toggle_mark(self) -> None:
        key = self.selected_key()
        if key is None or not self.MARKS:
            return
        self.marked.symmetric_difference_update({key})
        self._strips.pop(key, None)
        self._refresh_row(self.cursor_row)
        self.move_cursor(self.cursor_row + 1)

    def action_select(self) -> None:
        key = self.selected_key()
        if key is not None:
            self.post_message(self.Selected(self, key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < 0:  # the border
            return
        if offset.y == 0:  # the header: sort by the column clicked (again: reverse)
            x = 0
            for col, w in zip(self._cols, self._widths(self.size.width), strict=False):
                x += w + 2 * self.PADDING
                if offset.x < x:
                    event.stop()
                    if self.sort_by == col.key:
                        self.sort_on(col.key, not self.sort_reverse)
                    else:
                        self.sort_on(col.key)
                    return
            return
        y = offset.y
        index = int(self.scroll_y) + y - 1
        if 0 <= index < len(self._order):
            event.stop()
            if index == self.cursor_row:
                self.action_select()  # a click on the highlighted row opens it
            else:
                self.move_cursor(index)

    def on_focus(self) -> None:
        self._strips.clear()
        self.refresh()

    def on_blur(self) -> None:
        self._strips.clear()
        self.refresh()

    def on_resize(self) -> None:
        self._strips.clear()
        self._header = None
        if not self.lost:  # the selected row stays in sight in a smaller table
            self.call_after_refresh(self._scroll_to_cursor)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._header = None

    # ------------------------------------------------------------------------ render ---
    def _refresh_row(self, index: int) -> None:
        self.refresh(Region(0, index + 1 - int(self.scroll_y), self.size.width, 1))

    def _widths(self, width: int) -> list[int]:
        widths = [c.width_for(self.narrow) or 0 for c in self._cols]
        if widths:
            used = sum(w + 2 * self.PADDING for w in widths[:-1]) + 2 * self.PADDING
            if self._cols[-1].width_for(self.narrow) is None:
                widths[-1] = max(0, width - used)
        return widths

    def _line(self, cells: tuple[Cell, ...], width: int, base: Style) -> list[Segment]:
        console = self.app.console
        pad = Segment(" " * self.PADDING, base)
        segments: list[Segment] = []
        for cell, w in zip(cells, self._widths(width), strict=False):
            text = cell if isinstance(cell, Text) else Text(str(cell))
            text = text.copy()
            text.no_wrap = True
            text.overflow = "ellipsis"
            text.truncate(w, overflow="ellipsis", pad=True)
            # Text.render leaves out the text's own style when it has no spans: add it here
            style = base + console.get_style(text.style, default=Style.null()) \
                if text.style else base
            segments.append(pad)
            segments.extend(Segment.apply_style(text.render(console, end=""), style=style))
            segments.append(pad)
        return segments

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            sig = (width, base, self.sort_by, self.sort_reverse)
            if self._header is None or self._header[0] != sig:
                header_style = base + self.get_component_rich_style("rowtable--header")
                arrow = " ▼" if self.sort_reverse else " ▲"
                labels = tuple(Text(self._labels.get(c.key, c.label)
                                    + (arrow if c.key == self.sort_by else ""))
                               for c in self._cols)
                line = self._line(labels, width, header_style)
                self._header = (sig, Strip(line).crop_extend(0, width, header_style))
            return self._header[1]
        index = int(self.scroll_y) + y - 1
        if index >= len(self._order):
            return Strip.blank(width, base)
        key = self._order[index]
        cells = self._cells[key]
        cursor = index == self.cursor_row and not self.lost
        marked = key in self.marked
        sig = (cells, width, cursor, self.has_focus, base, marked)
        cached = self._strips.get(key)
        if cached is not None and cached[0] == sig:
            return cached[1]
        self.renders += 1
        style = base
        if cursor:
            name = "rowtable--cursor" if self.has_focus else "rowtable--cursor-blurred"
            cursor_style = self.get_component_rich_style(name)
            style = base + Style(bgcolor=cursor_style.bgcolor, bold=cursor_style.bold)
        if marked:
            mark = Text("●", style="bold yellow")
            first = cells[0] if isinstance(cells[0], Text) else Text(str(cells[0]))
            cells = (Text.assemble(mark, first[: max(0, len(first) - 1)]), *cells[1:])
            style = style + Style(bgcolor="#3a3a1a") if not cursor else style
        segments = self._line(cells, width, style if marked and not cursor else base)
        if cursor:
            segments = list(Segment.apply_style(segments, post_style=Style(
                bgcolor=style.bgcolor, bold=style.bold)))
        strip = Strip(segments).crop_extend(0, width, style)
        self._strips[key] = (sig, strip)
        return strip


_UNITS = {"G": 1024.0, "M": 1.0, "GiB": 1024.0, "MiB": 1.0}
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*(GiB|MiB|G|M|%|s)?")
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?$")


def natural_key(cell: Cell) -> tuple[int, float, str]:
    """How a cell sorts: numbers (sizes in MiB, durations in s) before text, empty last."""
    text = (cell.plain if isinstance(cell, Text) else str(cell)).strip()
    if not text or text in ("–", "-"):
        return (2, 0.0, "")
    m = _DURATION.match(text)
    if m and any(m.groups()):
        d, h, mi, sec = (float(g) if g else 0.0 for g in m.groups())
        return (0, ((d * 24 + h) * 60 + mi) * 60 + sec, text)
    m = _NUMBER.match(text)
    if m:
        return (0, float(m.group(1)) * _UNITS.get(m.group(2) or "", 1.0), text)
    return (1, 0.0, text.lower())
