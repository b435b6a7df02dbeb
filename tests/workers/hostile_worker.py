"""A hostile worker for the engine's attack tests, written on raw sockets, msgpack and struct.

Usage (as a backend command): ``python hostile_worker.py --control-socket P --data-socket P
--name N``, with the attack in ``$HOSTILE``.  It registers like our SDK (advertising the
extensions, so they are negotiated), says "ready", then answers each request:

- the *first* request with the attack — ``envelope-int`` (an envelope whose payload is the
  int 2**31), ``status-huge`` (status code 2**64-1), ``headers-list`` (headers that are a
  list), ``error-status-huge`` (an ERROR whose status code is 2**64-1), ``progress-junk``
  (progress of NaN, inf, 1e308 and -1, then 0.5; it replies once the job is cancelled),
  ``unknown-event`` (an event of code
  99 on control, then a good reply), ``unanswered`` (a reply to a request never sent, then a
  good reply), ``fatal`` (a frame with an unknown type code, then it stays alive and silent);
- every later request with an echo, the way an honest worker would;
- ``junk-registration`` registers with metadata that is not a map, and then waits;
- ``chunk-flood`` streams ``$FLOOD_MIB`` MiB of 64 KiB chunks as fast as the socket takes
  them, then ends the stream.

Nothing here uses vramtui code: the frames are what a hostile process could write.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack

HEADER = struct.Struct(">QBBH")
FEATURES = "cancel,envelope,error-status,init-failure,progress,quiet-status,stream"


def frame(msg_type: int, data_type: int, msg_id: int, payload: object) -> bytes:
    body = msgpack.packb({"id": msg_id, "message_type": msg_type, "data_type": data_type,
                          "timestamp": None, "payload": payload}, use_bin_type=True)
    return HEADER.pack(len(body), msg_type, data_type, 0) + body


def read_frames(sock: socket.socket) -> Iterator[tuple[int, int, Any]]:
    buf = b""
    while True:
        data = sock.recv(1 << 20)
        if not data:
            return
        buf += data
        while len(buf) >= HEADER.size:
            length, msg_type, dtype, _ = HEADER.unpack_from(buf)
            if len(buf) < HEADER.size + length:
                break
            body = msgpack.unpackb(buf[HEADER.size:HEADER.size + length], raw=False,
                                   timestamp=2)
            buf = buf[HEADER.size + length:]
            yield msg_type, dtype, body


CANCELLED = threading.Event()


def first_reply(attack: str, control: socket.socket, data: socket.socket, wire_id: int,
                payload: bytes) -> bool:
    """Answer the first request with the attack; True when it answered it for good."""
    if attack == "fatal":
        data.sendall(HEADER.pack(4, 200, 0, 0) + b"\x80\x80\x80\x80")
        time.sleep(60)
        return True
    if attack == "chunk-flood":
        chunk = b"c" * 65536
        for _ in range(int(os.environ.get("FLOOD_MIB", "64")) * 16):
            data.sendall(frame(7, 2, wire_id, chunk))
        data.sendall(frame(7, 2, wire_id, None))
        return True
    if attack in ("envelope-int", "status-huge", "headers-list"):
        inner: dict[str, Any] = {"payload": payload, "headers": {}, "status_code": 200}
        if attack == "envelope-int":
            inner["payload"] = 2**31
        elif attack == "status-huge":
            inner["status_code"] = 2**64 - 1
        else:
            inner["headers"] = [["X-Evil", "1"]]
        data.sendall(frame(7, 3, wire_id, msgpack.packb(inner, use_bin_type=True)))
        return True
    if attack == "error-status-huge":
        data.sendall(frame(8, 0, wire_id, {"error": "boom", "type": "prediction_error",
                                           "status_code": 2**64 - 1}))
        return True
    if attack == "progress-junk":
        for fraction in (math.nan, math.inf, 1e308, -1.0):
            control.sendall(frame(4, 0, 10, {"event": 1, "request": wire_id,
                                             "fraction": fraction, "message": "junk"}))
        control.sendall(frame(4, 0, 11, {"event": 1, "request": wire_id, "fraction": 0.5,
                                         "message": "half"}))
        CANCELLED.wait(30)  # (the test cancels once it saw the 0.5)
    elif attack == "unknown-event":
        control.sendall(frame(4, 0, 10, {"event": 99, "status": "ready"}))
    elif attack == "unanswered":
        data.sendall(frame(7, 0, wire_id + 1000, b"to nobody"))
    return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control-socket", required=True)
    parser.add_argument("--data-socket", required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    attack = os.environ.get("HOSTILE", "")
    control = socket.socket(socket.AF_UNIX)
    control.connect(args.control_socket)
    data = socket.socket(socket.AF_UNIX)
    data.connect(args.data_socket)
    metadata: object = {"language": "python", "version": "1.0", "vramtui-protocol": "1",
                        "vramtui-features": FEATURES}
    if attack == "junk-registration":
        metadata = ["not", "a", "map"]
    reg = {"identifier": args.name, "type": "ml_worker", "metadata": metadata}
    control.sendall(frame(0, 0, 1, reg))
    data.sendall(frame(0, 0, 1, reg))
    if attack == "junk-registration":
        time.sleep(60)
        return
    control.sendall(frame(4, 0, 2, {"event": 5, "status": "initializing"}))
    control.sendall(frame(4, 0, 3, {"event": 5, "status": "ready"}))

    def drain_control() -> None:  # read the ACK, cancels, shutdowns; answer pings
        for msg_type, _dtype, body in read_frames(control):
            if msg_type == 5:
                control.sendall(frame(6, 0, body["id"], {"event": 0}))
            elif msg_type == 4 and body["payload"].get("event") == 3:
                os._exit(0)  # SHUTDOWN
            elif msg_type == 4 and body["payload"].get("event") == 2:
                CANCELLED.set()

    threading.Thread(target=drain_control, daemon=True).start()
    served = 0
    for msg_type, _dtype, body in read_frames(data):
        if msg_type != 7:
            continue
        wire_id = body["id"]
        env = body["payload"]
        payload = env["payload"] if isinstance(env, dict) else env
        served += 1
        if served == 1 and attack and first_reply(attack, control, data, wire_id, payload):
            continue
        data.sendall(frame(7, 0, wire_id, payload))


if __name__ == "__main__":
    main()
