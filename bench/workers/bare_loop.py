"""The floor for bench/protocol.py: a worker that only does recv -> decode -> encode -> send.

Usage: ``python bare_loop.py [SCRIPT] --control-socket P --data-socket P --name N``.  It
registers on both sockets as a plain verda-io worker (no extensions), says "ready", then
echoes every DATA payload with msgpack and struct, straight from the socket: no SDK, no
status events, no request context, no validation.  Nothing a real worker could ship; it shows
what the wire format itself costs.
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time

import msgpack

HEADER = struct.Struct(">QBBH")


def frame(msg_type: int, data_type: int, msg_id: int, payload: object) -> bytes:
    ns = time.time_ns()
    stamp = b"\xc7\x0c\xff" + struct.pack(">qi", ns // 1_000_000_000, ns % 1_000_000_000)
    body = (b"\x85\xa2id" + msgpack.packb(msg_id) + b"\xacmessage_type" + msgpack.packb(msg_type)
            + b"\xa9data_type" + msgpack.packb(data_type) + b"\xa9timestamp" + stamp
            + b"\xa7payload" + msgpack.packb(payload, use_bin_type=True))
    return HEADER.pack(len(body), msg_type, data_type, 0) + body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("script", nargs="?")
    parser.add_argument("--control-socket", required=True)
    parser.add_argument("--data-socket", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    control = socket.socket(socket.AF_UNIX)
    control.connect(args.control_socket)
    data = socket.socket(socket.AF_UNIX)
    data.connect(args.data_socket)
    reg = {"identifier": args.name, "type": "ml_worker",
           "metadata": {"language": "python", "version": "1.0"}}
    control.sendall(frame(0, 0, 1, reg))
    data.sendall(frame(0, 0, 1, reg))
    control.sendall(frame(4, 0, 2, {"event": 5, "status": "initializing"}))
    control.sendall(frame(4, 0, 3, {"event": 5, "status": "ready"}))
    threading.Thread(target=lambda: all(iter(lambda: control.recv(65536), b"")),
                     daemon=True).start()  # read (and drop) the control socket
    buf = bytearray(1 << 22)
    view = memoryview(buf)
    have = 0
    while n := data.recv_into(view[have:]):
        have += n
        while have >= HEADER.size:
            length, msg_type, _dtype, _ = HEADER.unpack_from(buf, 0)
            end = HEADER.size + length
            if have < end:
                break
            msg = msgpack.unpackb(view[HEADER.size:end], raw=False, timestamp=2)
            if msg_type == 7:
                data.sendall(frame(7, 0, msg["id"], msg["payload"]))
            elif msg_type == 5:
                data.sendall(frame(6, 0, msg["id"], {"event": 0}))
            buf[: have - end] = buf[end:have]
            have -= end


if __name__ == "__main__":
    main()
