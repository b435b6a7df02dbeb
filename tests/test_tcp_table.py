"""The kernel's TCP table, read two ways: sock_diag netlink and /proc must name the same
sockets, and a port's listeners are asked of netlink, not parsed out of every socket of the
host on each check (``supervisor/tcp_table.py``). The truth is the kernel's: real sockets,
and the other of the two readings."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from other_user import OTHER_UID, needs_other_user, start_as_other_user

from supervisor import tcp_table
from supervisor.servers import listener
from supervisor.tcp_table import LISTEN, TABLES, ask_diag, listening, read_rows


@contextlib.contextmanager
def listener_on(family: int = socket.AF_INET) -> Iterator[int]:
    host = "127.0.0.1" if family == socket.AF_INET else "::1"
    try:
        sock = socket.create_server((host, 0), family=family)
    except OSError as exc:
        pytest.skip(f"no {host} here: {exc}")
    with sock:
        yield sock.getsockname()[1]


def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a process that has not asked yet (whether netlink tells the truth is learned once)."""
    monkeypatch.setattr(tcp_table, "diag_state", tcp_table.DiagState())


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_netlink_and_proc_name_the_same_listener(family: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fresh(monkeypatch)
    with listener_on(family) as port:
        try:
            asked = [r for r in ask_diag(family, states=1 << LISTEN) if r.local[1] == port]
        except tcp_table.DiagUnavailable as exc:
            pytest.skip(f"no sock_diag here: {exc}")
        read = read_rows(TABLES[family], state=LISTEN, local_port=port)
        assert len(asked) == 1 and asked == read, (asked, read)
        assert asked[0].uid == os.getuid() and asked[0].inode != 0
        assert listening(family, port) == read
        monkeypatch.setattr(tcp_table, "use_diag", False)
        assert listening(family, port) == read


def test_proc_is_read_once_to_check_netlink_then_never_per_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each poll of a starting server asks who listens on its port: /proc lists every socket
    of the host (a busy one: tens of thousands, 30 ms per 3,400 here), netlink only the
    listeners."""
    fresh(monkeypatch)
    reads: list[object] = []
    real = tcp_table.read_rows
    monkeypatch.setattr(tcp_table, "read_rows", lambda *a, **k: reads.append(a) or real(*a, **k))
    with listener_on() as port:
        try:
            ask_diag(socket.AF_INET, states=1 << LISTEN)
        except tcp_table.DiagUnavailable as exc:
            pytest.skip(f"no sock_diag here: {exc}")
        url = f"http://127.0.0.1:{port}"
        assert listener.listeners_of(url) == {os.getuid()}
        first = len(reads)
        assert first >= 1  # the check that netlink tells what /proc does
        for _ in range(20):
            assert listener.listeners_of(url) == {os.getuid()}
        assert len(reads) == first


def test_a_netlink_that_answers_nothing_where_proc_lists_listeners_is_not_believed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandbox may answer sock_diag with an empty dump: believed, no server's listener would
    ever be seen (and its secret never checked against a squatter)."""
    fresh(monkeypatch)
    monkeypatch.setattr(tcp_table, "ask_diag", lambda *a, **k: [])
    with listener_on() as port:
        url = f"http://127.0.0.1:{port}"
        assert listener.listeners_of(url) == {os.getuid()}  # read from /proc
        assert tcp_table.diag_state.truthful is False


def test_netlink_is_not_believed_on_a_silence_shared_with_proc(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing listening anywhere tells nothing of a netlink that always answers nothing:
    it is checked against /proc again until one of them names a listener."""
    fresh(monkeypatch)
    monkeypatch.setattr(tcp_table, "ask_diag", lambda *a, **k: [])
    empty = tmp_path / "tcp"
    empty.write_text(TABLES[socket.AF_INET].read_text().splitlines()[0] + "\n")
    real = dict(TABLES)
    monkeypatch.setattr(tcp_table, "TABLES", {**real, socket.AF_INET: empty})
    assert listening(socket.AF_INET, 80) == []
    assert tcp_table.diag_state.truthful is None
    monkeypatch.setattr(tcp_table, "TABLES", real)
    with listener_on() as port:
        assert listener.listeners_of(f"http://127.0.0.1:{port}") == {os.getuid()}
        assert tcp_table.diag_state.truthful is False


def test_where_netlink_is_refused_proc_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh(monkeypatch)

    def refused(*args: object, **kwargs: object) -> list[tcp_table.Row]:
        raise tcp_table.DiagUnavailable("Operation not permitted")

    monkeypatch.setattr(tcp_table, "ask_diag", refused)
    with listener_on() as port:
        assert listener.listeners_of(f"http://127.0.0.1:{port}") == {os.getuid()}


def test_a_family_netlink_refused_is_read_from_proc_by_both_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once refused, netlink is not asked again for that family: the listener check and the
    door's peer check both read /proc, and still name the owner."""
    from supervisor.http.peer import identify_socket

    fresh(monkeypatch)
    tcp_table.diag_state.refused.add(socket.AF_INET)
    with pytest.raises(tcp_table.DiagUnavailable):
        ask_diag(socket.AF_INET, states=1 << LISTEN)
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()):
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        assert listener.listeners_of(url) == {os.getuid()}
        accepted, _ = server.accept()
        with accepted:
            assert identify_socket(accepted).uid == os.geteuid()


def test_the_proc_filters_keep_exactly_the_rows_asked_for(tmp_path: Path) -> None:
    """Rows not asked for are not parsed, and the rows kept are those a full read keeps."""
    with listener_on() as port, socket.create_connection(("127.0.0.1", port)):
        table = tmp_path / "tcp"
        table.write_text(TABLES[socket.AF_INET].read_text()
                         + "  99: 0100007F:ZZZZ 00000000:0000 0A garbage\n")  # malformed: left out
        every = read_rows(table)
        for state, local_port in [(LISTEN, port), (LISTEN, None), (None, port),
                                  (tcp_table.ESTABLISHED, None)]:
            kept = read_rows(table, state=state, local_port=local_port)
            assert kept == [r for r in every if (state is None or r.state == state)
                            and (local_port is None or r.local[1] == local_port)]
            assert kept


@pytest.mark.process
@needs_other_user
@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0", "::"])
def test_another_users_listener_is_named_however_it_binds(
        bind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A squatter of another uid on the loopback address, on IPv4's wildcard, or on IPv6's
    (which takes IPv4 too): netlink names its uid where a connection to 127.0.0.1 would go,
    as /proc does."""
    fresh(monkeypatch)
    family = "socket.AF_INET6" if ":" in bind else "socket.AF_INET"
    other = start_as_other_user(
        "import socket, sys\n"
        f"s = socket.socket({family})\n"
        "if s.family == socket.AF_INET6: s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
        f"s.bind(({bind!r}, 0))\ns.listen()\n"
        "print(s.getsockname()[1], flush=True)\nsys.stdin.read()\n")
    try:
        assert other.stdout is not None
        port = int(other.stdout.readline() or 0)
        assert port, other.stderr.read() if other.stderr else ""
        url = f"http://127.0.0.1:{port}"
        assert listener.listeners_of(url) == {OTHER_UID}
        monkeypatch.setattr(tcp_table, "use_diag", False)
        assert listener.listeners_of(url) == {OTHER_UID}
    finally:
        other.kill()
        other.communicate(timeout=10)
