"""Lines of JSON and of event streams that every line splitter reads as the lines they are."""

from __future__ import annotations

import json

from supervisor.http.openai_routes import data_lines
from supervisor.jsonline import dumps_line
from supervisor.workers.jsonl import encode

TRICKY = {"t": "a\u2028b\u2029c\x85d\ne", "n": [1, 2.5, None]}


def test_a_json_line_is_one_line_for_every_splitter_and_the_same_value() -> None:
    text = dumps_line(TRICKY)
    assert text.splitlines() == [text]  # (str.splitlines breaks at U+2028, U+2029, U+0085)
    assert json.loads(text) == TRICKY
    assert dumps_line({"é": "ü"}) == '{"é":"ü"}'  # the rest stays UTF-8 text
    line = encode("job", **TRICKY)
    assert line.endswith(b"\n") and line.decode().splitlines() == [line.decode()[:-1]]


def test_an_event_streams_data_lines_break_only_where_sse_does() -> None:
    """A JSON chunk on one ``data:`` line; text split at CR LF, CR or LF (an event stream's
    line ends: a bare CR left in a line would end it there for the client)."""
    assert data_lines(json.dumps(TRICKY, ensure_ascii=False).encode()) == \
        b"data: " + dumps_line(TRICKY).encode() + b"\n\n"
    assert data_lines(b"one\r\ntwo\rthree\nfour") == \
        b"data: one\ndata: two\ndata: three\ndata: four\n\n"


def test_a_relayed_event_stream_goes_out_event_by_event_and_byte_for_byte() -> None:
    """A server's event stream is relayed as it came, bytes unchanged, but an event goes out
    once it is whole (a blank line, in any of the three line ends, split across pieces or
    not): a stream that breaks off then never leaves half an event before its error."""
    from supervisor.http.forward import _RawEncoder

    enc = _RawEncoder(None, "j", None)  # type: ignore[arg-type]
    enc.sse = True
    pieces = [b"data: 1\r\n", b"\r\ndata: 2\n", b"\ndata: 3\r", b"\rdata: {\"a\"", b": 4}"]
    sent = [enc._body(p) for p in pieces]
    assert sent == [b"", b"data: 1\r\n\r\n", b"data: 2\n\n", b"data: 3\r\r", b""]
    assert b"".join(sent) + enc.end(None) == b"".join(pieces)  # (its end: what was held)
