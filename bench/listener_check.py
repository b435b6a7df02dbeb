"""What asking who listens on a port costs, as the host's TCP table grows.

While a model server starts, the engine asks every 20 ms who listens on its port
(``supervisor/servers/listener.py``: another user may have taken it), on the engine's loop:
whatever that costs, every door and every other model's request waits for. ``/proc/net/tcp``
lists every socket of the host, TIME_WAIT ones included (a busy proxy host has tens of
thousands), and is printed by the kernel and parsed by us in full; sock_diag netlink is asked
for the listeners alone (``supervisor/tcp_table.py``). This fills the table with closed
connections (TIME_WAIT rows, as a busy host has) and times one check each way, median of
many, beside the whole parse of both tables that it replaced. Prints a table; never run as
a test.

    .venv/bin/python bench/listener_check.py [--sizes 0,2000,8000] [--repeat 30]
"""

# ruff: noqa: E402  (the path is fixed before the imports: see below)
from __future__ import annotations

import os
import sys

# bench/http.py is beside this file: keep the folder off the path so `http` is the stdlib's.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import socket
import statistics
import time

from supervisor import tcp_table
from supervisor.servers.listener import listeners_of


def rows_now() -> int:
    with open(tcp_table.TABLES[socket.AF_INET], encoding="ascii") as f:
        return sum(1 for _ in f) - 1


def fill(server: socket.socket, n: int) -> None:
    """``n`` connections opened and closed by this side first: each leaves a TIME_WAIT row."""
    address = server.getsockname()
    for _ in range(n):
        c = socket.create_connection(address)
        a, _ = server.accept()
        c.close()
        a.close()


def timed(url: str, repeat: int, diag: bool) -> float:
    tcp_table.use_diag = diag
    listeners_of(url)  # (the first ask checks netlink against /proc once: not timed)
    took = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        listeners_of(url)
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1000


def timed_whole(repeat: int) -> float:
    """The check before netlink: both tables read and every row parsed, then filtered."""
    took = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for table in tcp_table.TABLES.values():
            [r for r in tcp_table.read_rows(table) if r.state == tcp_table.LISTEN]
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0,2000,8000",
                        help="TIME_WAIT rows to add before each row of the table")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    server = socket.create_server(("127.0.0.1", 0), backlog=512)
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        tcp_table.ask_diag(socket.AF_INET, states=1 << tcp_table.LISTEN)
        netlink = True
    except tcp_table.DiagUnavailable as exc:
        print(f"(no sock_diag here: {exc}; /proc only)")
        netlink = False
    print(f"{'rows in /proc/net/tcp':>22} {'all parsed ms':>14} {'/proc ms':>9} "
          f"{'netlink ms':>11} {'ratio':>7}")
    added = 0
    for size in (int(s) for s in args.sizes.split(",")):
        fill(server, max(0, size - added))
        added = max(added, size)
        whole = timed_whole(args.repeat)
        proc = timed(url, args.repeat, diag=False)
        nl = timed(url, args.repeat, diag=True) if netlink else float("nan")
        print(f"{rows_now():22d} {whole:14.2f} {proc:9.2f} {nl:11.3f} {whole / nl:6.0f}x")
    server.close()
    print("one check, median. all parsed: as before netlink (every row of both tables parsed);"
          " /proc: the fallback now (only listeners parsed); ratio: all parsed / netlink. A "
          "starting server is checked every 20 ms for its first 3 s")


if __name__ == "__main__":
    main()
