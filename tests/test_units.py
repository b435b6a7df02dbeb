"""supervisor.units: every way a size or a duration is read or written, each pinned to the
strings users see today, and each descriptor form read back by the parsers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.units import (
    MAX_DURATION_S,
    MAX_SIZE_MIB,
    bytes_text,
    format_duration,
    format_seconds,
    format_size,
    format_size_mib,
    mib_exact,
    mib_from_gib,
    mib_rounded_up,
    mib_short,
    mib_text,
    mib_whole,
    parse_duration,
    parse_size,
    seconds_ago,
    seconds_short,
    seconds_text,
)

# -- reading, and reading back what is written for descriptors ------------------------------


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        (0, 0),
        (12288, 12288),
        (12288.0, 12288),
        ("12288", 12288),
        ("12GiB", 12288),
        ("12 GiB", 12288),
        ("12gib", 12288),
        ("1.5GiB", 1536),
        ("512MiB", 512),
        ("2048KiB", 2),
        ("1KiB", 1),  # rounded up
        ("1000MB", 954),  # 953.67 MiB
        ("12GB", 11445),  # 11444.09 MiB
        ("1TiB", 1048576),
        ("0GiB", 0),
    ],
)
def test_parse_size(text: object, mib: int) -> None:
    assert parse_size(text) == mib


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("12 GB x", "is not a size (use e.g. 12GiB or 12288)"),
        ("12G", "unknown unit 'G'"),
        ("-1GiB", "negative"),
        (-5, "negative"),
        (6.5, "not a whole number of MiB"),
        (True, "not a size"),
        ([1], "not a size"),
        ("", "not a size"),
    ],
)
def test_parse_size_rejects(value: object, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(value)
    assert fragment in str(info.value)


@given(st.integers(min_value=0, max_value=MAX_SIZE_MIB // 1024))  # its GiB: at most 1 PiB
def test_size_format_round_trip(mib: int) -> None:
    assert parse_size(format_size(mib)) == mib
    assert parse_size(f"{mib} MiB") == mib
    assert parse_size(f"{mib}GiB") == mib * 1024
    assert parse_size(f"{mib * 1024}KiB") == mib


@given(st.integers(min_value=0, max_value=MAX_SIZE_MIB // 1024 - 1),
       st.integers(min_value=0, max_value=1023))
def test_fractional_gib_round_trip(whole: int, part: int) -> None:
    # k/1024 GiB written as a decimal is exact in binary when part is a multiple of 1/1024
    text = f"{whole + part / 1024:.10f}GiB"
    assert parse_size(text) == whole * 1024 + part


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (2.5, 2.5),
        ("300", 300.0),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("500ms", 0.5),
        ("2d", 172800.0),
        ("1.5min", 90.0),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


def test_parse_duration_infinite_and_errors() -> None:
    assert parse_duration("never", allow_infinite=True) == math.inf
    assert parse_duration("Forever", allow_infinite=True) == math.inf
    for bad in ("never", "5 mins", "m5", "-3s", -1, True, "1h30", None):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_a_huge_exponent_is_an_error_at_once_not_a_ten_million_digit_number() -> None:
    """``1e9999999`` used to build 10**9999999 exactly (about 10 s of the engine's loop when
    it came over HTTP), and ``1e400`` to raise OverflowError (a 500, a CLI traceback)."""
    for text in ("1e400", "1e9999999"):  # (finite figures, past a float's range)
        with pytest.raises(ValueError, match="is more than 10 years"):
            parse_duration(text)
    assert parse_duration("1e9999999", allow_infinite=True) == math.inf
    assert parse_duration("1e-400") == 0.0 and parse_duration("1e3") == 1000.0
    with pytest.raises(ValueError, match="too long"):
        parse_duration("1" * 5000 + "s")
    with pytest.raises(ValueError, match="is more than 10 years"):  # an int past a float
        parse_duration(10**400)
    with pytest.raises(ValueError, match="negative"):
        parse_duration(-(10**400))
    for infinite in ("inf", " Never ", math.inf):  # infinite as written: never, if allowed
        with pytest.raises(ValueError, match="must be finite"):
            parse_duration(infinite)
        assert parse_duration(infinite, allow_infinite=True) == math.inf


@pytest.mark.parametrize("value", ["99999999999999d", "1e300", "1e308", "9e18", 9e18, 1e300,
                                   "3651d", "3650d1s", 2**64, "87601h"])
def test_a_duration_of_more_than_ten_years_is_one_line_or_never(value: object) -> None:
    """``99999999999999d`` read as 8.64e18 s, which overflowed every wait it reached (a
    thread's wait or ``time.sleep`` past about 292 years raises OverflowError): now it is
    refused in one line that says what to write, or read as never where never is allowed."""
    with pytest.raises(ValueError) as info:
        parse_duration(value)
    message = str(info.value)
    assert "is more than 10 years" in message and "write at most 3650d" in message
    assert "\n" not in message
    assert parse_duration(value, allow_infinite=True) == math.inf


@pytest.mark.parametrize("value", ["3650d", "87600h", 315360000, "1e-300", 0, "0s", "366d",
                                   "1000h", 1e8])
def test_every_duration_up_to_ten_years_still_reads(value: object) -> None:
    seconds = parse_duration(value)
    assert 0 <= seconds <= MAX_DURATION_S == 3650 * 86400
    assert parse_duration(value, allow_infinite=True) == seconds


@given(st.floats(min_value=0, max_value=MAX_DURATION_S, allow_nan=False)
       | st.integers(0, int(MAX_DURATION_S)))
def test_duration_format_round_trip(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == float(seconds)


@given(st.integers(min_value=0, max_value=MAX_SIZE_MIB))
def test_size_in_mib_reads_back(mib: int) -> None:
    assert format_size_mib(mib) == f"{mib}MiB"
    assert parse_size(format_size_mib(mib)) == mib


@given(st.integers(0, int(MAX_DURATION_S))
       | st.sampled_from([0.5, 2.5, 0.25, 1.125, 1e-5, 2.5e-7, 1e-300]))
def test_seconds_form_reads_back(seconds: float) -> None:
    # six significant digits, as ``backends describe`` has always shown them, and whole
    # seconds from 1e6 s up (``timeouts: {request: 30d}`` showed as 2.592e+06s, no duration)
    assert parse_duration(format_seconds(seconds)) == float(seconds)


def test_seconds_form_examples() -> None:
    assert [format_seconds(s) for s in (0, 30, 90.0, 2.5, 3600)] == ["0s", "30s", "90s", "2.5s",
                                                                      "3600s"]
    assert [format_seconds(s) for s in (999_999, 2_592_000, 1e6, 1e-5, MAX_DURATION_S)] == [
        "999999s", "2592000s", "1000000s", "1e-05", "315360000s"]


@pytest.mark.parametrize(("gib", "mib"), [(0, 0), (1, 1024), (1.5, 1536), (0.1, 103),
                                           (7.2, 7373), (24.0, 24576), (-1, 0)])
def test_mib_from_gib_rounds_up_but_not_for_float_noise(gib: float, mib: int) -> None:
    assert mib_from_gib(gib) == mib


# -- writing for people: each style, pinned ------------------------------------------------


@pytest.mark.parametrize(("n", "text"), [
    (None, "–"), (0, "0 MiB"), (700, "700 MiB"), (1023, "1023 MiB"), (1024, "1.0 GiB"),
    (1536, "1.5 GiB"), (102400, "100.0 GiB"), (130000, "127.0 GiB"), (-2048, "-2.0 GiB"),
    (-5, "-5 MiB"),
])
def test_mib_text_is_the_cli_style(n: int | None, text: str) -> None:
    assert mib_text(n) == text


@pytest.mark.parametrize(("n", "text", "compact"), [
    (None, "n/a", "–"), (0, "0 MiB", "0M"), (700, "700 MiB", "700M"),
    (1024, "1.0 GiB", "1.0G"), (1536, "1.5 GiB", "1.5G"), (13056, "12.8 GiB", "12.8G"),
    (101376, "99.0 GiB", "99.0G"), (102400, "100 GiB", "100G"), (130000, "127 GiB", "127G"),
    (-2048, "-2.0 GiB", "-2.0G"),
])
def test_mib_short_is_the_tui_style(n: int | None, text: str, compact: str) -> None:
    assert mib_short(n) == text
    assert mib_short(n, compact=True) == compact


@pytest.mark.parametrize(("n", "text"), [
    (1, "1 MiB"), (700, "700 MiB"), (1024, "1 GiB"), (1536, "1.5 GiB"), (8192, "8 GiB"),
    (24576, "24 GiB"), (81920, "80 GiB"), (1025, "1.00098 GiB"),
])
def test_mib_exact_is_a_devices_size(n: int, text: str) -> None:
    assert mib_exact(n) == text


def test_mib_whole_never_rounds() -> None:
    assert [mib_whole(n) for n in (None, 0, 700, 13056)] == ["–", "0 MiB", "700 MiB",
                                                              "13056 MiB"]


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 MiB"), (1000, "1000 MiB"), (1023, "1023 MiB"), (1024, "1.0 GiB"),
    (1025, "1.1 GiB"), (10547, "10.3 GiB"), (10240, "10.0 GiB"), (13056, "12.8 GiB"),
])
def test_mib_rounded_up_is_a_size_to_declare(n: int, text: str) -> None:
    assert mib_rounded_up(n) == text
    assert mib_rounded_up(n, compact=True) == text.replace(" GiB", "G").replace(" MiB", "M")


@given(st.integers(min_value=0, max_value=2**30))
def test_a_size_to_declare_is_never_below_the_figure(n: int) -> None:
    assert parse_size(mib_rounded_up(n)) >= n


@pytest.mark.parametrize(("n", "text", "tenths"), [
    (0, "0 bytes", "0 bytes"), (1023, "1023 bytes", "1023 bytes"), (1024, "1 KiB", "1.0 KiB"),
    (1536, "1.5 KiB", "1.5 KiB"), (64 << 20, "64 MiB", "64.0 MiB"),
    ((64 << 20) + 1, "64.0 MiB", "64.0 MiB"), (3 << 29, "1.5 GiB", "1.5 GiB"),
    (1 << 30, "1 GiB", "1.0 GiB"), (5 << 40, "5120 GiB", "5120.0 GiB"),
])
def test_bytes_text_for_messages(n: int, text: str, tenths: str) -> None:
    assert bytes_text(n) == text
    assert bytes_text(n, always_tenths=True) == tenths


@pytest.mark.parametrize(("s", "text"), [
    (None, "–"), (0.0, "0 ms"), (0.25, "250 ms"), (0.9996, "1000 ms"), (1.0, "1.0 s"),
    (12.34, "12.3 s"), (89.9, "89.9 s"), (90.0, "2 min"), (300.0, "5 min"),
    (5399.0, "90 min"), (5400.0, "1.5 h"), (7200.0, "2.0 h"),
])
def test_seconds_text_is_the_cli_style(s: float | None, text: str) -> None:
    assert seconds_text(s) == text


@pytest.mark.parametrize(("s", "text"), [
    (None, "–"), (-3.0, "0.0s"), (0.0, "0.0s"), (0.44, "0.4s"), (9.96, "10.0s"), (12.4, "12s"),
    (59.4, "59s"), (59.6, "59s"), (60.0, "1m00s"),
    (math.nan, "–"), (math.inf, "–"), (185.0, "3m05s"), (3599.9, "59m59s"), (3720.0, "1h02m"),
    (86399.0, "23h59m"), (86400.0 * 2 + 3 * 3600, "2d03h"),
])
def test_seconds_short_is_the_tui_style(s: float | None, text: str) -> None:
    assert seconds_short(s) == text


@pytest.mark.parametrize(("s", "text"), [
    (None, "never"), (0.0, "just now"), (9.9, "just now"), (10.0, "10s ago"),
    (29.0, "20s ago"), (59.9, "50s ago"), (60.0, "1m ago"), (3599.0, "59m ago"),
    (3720.0, "1h02m ago"), (36300.0, "10h ago"), (90000.0, "1d01h ago"),
    (86400.0 * 41, "41d ago"), (math.nan, "never"), (math.inf, "never"), (-math.inf, "never"),
])
def test_seconds_ago(s: float | None, text: str) -> None:
    assert seconds_ago(s) == text


def test_nothing_here_is_infinite_or_nan_by_accident() -> None:
    assert format_duration(math.inf) == "never"
    with pytest.raises(ValueError):
        format_duration(math.nan)
    with pytest.raises(ValueError):
        format_size(-1)
