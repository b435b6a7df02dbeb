"""Bare loop worker: recv -> decode -> encode -> send."""
import socket, struct, sys, time, threading, argparse
import msgpack
p = argparse.ArgumentParser(); p.add_argument("script", nargs="?"); p.add_argument("--control-socket"); p.add_argument("--data-socket"); p.add_argument("--name")
a = p.parse_args()
H = struct.Struct(">QBBH")
def gotime():
    ns = time.time_ns(); return b"\xc7\x0c\xff" + struct.pack(">qi", ns // 10**9, ns % 10**9)
def frame(mt, dt, mid, payload):
    body = b"\x85\xa2id" + msgpack.packb(mid) + b"\xacmessage_type" + msgpack.packb(mt) + b"\xa9data_type" + msgpack.packb(dt) + b"\xa9timestamp" + gotime() + b"\xa7payload" + msgpack.packb(payload, use_bin_type=True)
    return H.pack(len(body), mt, dt, 0) + body
def conn(path):
    s = socket.socket(socket.AF_UNIX); s.connect(path); return s
c = conn(a.control_socket); d = conn(a.data_socket)
reg = {"identifier": a.name, "type": "ml_worker", "metadata": {"language": "python", "version": "1.0"}}
c.sendall(frame(0, 0, 1, reg)); d.sendall(frame(0, 0, 1, reg))
c.sendall(frame(4, 0, 2, {"event": 5, "status": "initializing"}))
c.sendall(frame(4, 0, 3, {"event": 5, "status": "ready"}))
def ctl():
    while c.recv(65536): pass
threading.Thread(target=ctl, daemon=True).start()
buf = bytearray(1 << 22); view = memoryview(buf)
have = 0
ext = lambda code, data: msgpack.ExtType(code, data)
while True:
    n = d.recv_into(view[have:])
    if not n: break
    have += n
    while have >= 12:
        length, mt, dt, _ = H.unpack_from(buf, 0)
        if have < 12 + length: break
        msg = msgpack.unpackb(view[12:12+length], raw=False, ext_hook=ext)
        if mt == 7:
            d.sendall(frame(7, 0, msg["id"], msg["payload"]))
        elif mt == 5:
            d.sendall(frame(6, 0, msg["id"], {"event": 0}))
        rest = have - 12 - length
        buf[:rest] = buf[12+length:have]; have = rest
