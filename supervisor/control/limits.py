"""Every limit of the control socket, in one place, with why each exists.

Each figure bounds something a client can make the engine hold: connections, bytes being
received, replies not read yet, requests not answered yet, waits and subscriptions.  A client
over a limit is answered with an error when it can be (and the connection goes on), or cut off
with a logged reason when it cannot (it does not read, it sends half a frame and stops, it
stays silent).  The owner's own CLI always gets in: idle connections give way to new ones, a
few slots are kept for the engine's own user, and connections that hold subscriptions or waits
can never take the last ones.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class ControlLimits:
    # One request frame (its body); larger ones are skipped as they arrive and answered.
    max_request: int = 64 * MiB
    # Connections at once.  When all are taken, the one idle the longest (no request, wait or
    # subscription in flight) is closed to let a new one in.
    max_connections: int = 128
    # Slots only the engine's own user (and root) may take: other users (--allow-group) get
    # at most max_connections - owner_reserve, and connections holding subscriptions or waits
    # at most that many too, so a short request always finds a slot.
    owner_reserve: int = 8
    # Bytes of large request frames (over 64 KiB) being received, all connections together.
    # A large frame beyond it is skipped and answered "busy, try again": a few clients that
    # announce 64 MiB and send nothing more cannot make the engine hold more than this.
    max_receiving: int = 128 * MiB
    # A connection with more unsent bytes than this gets no new replies or events until it
    # reads (its requests wait in the socket; its subscriptions drop events, counted).
    write_high: int = 256 * 1024
    # One reply larger than this is replaced by an error saying so.  A connection whose unsent
    # bytes ever exceed write_high + max_reply is cut off (it cannot happen while the rules
    # above hold; this is the backstop).
    max_reply: int = 256 * MiB
    # Seconds a connection may take to say hello.
    hello_timeout_s: float = 10.0
    # Seconds a connection may stay idle after hello (nothing in flight) before it is closed.
    # Clients reconnect by themselves.
    idle_timeout_s: float = 120.0
    # Seconds one request frame may take to arrive whole, once begun.
    frame_timeout_s: float = 10.0
    # Seconds a connection may take to say hello, or to send a frame it has begun, and still
    # count as busy.  Past it, a connection that trickles its bytes is no better than an idle
    # one: when every slot is taken, it gives way to a newcomer (so a client that dribbles
    # bytes into every slot cannot keep ``vramtui status`` out).
    partial_grace_s: float = 1.0
    # Seconds a connection may leave its replies unread (over write_high) before it is cut off.
    stall_timeout_s: float = 60.0
    # Waits (wait, submit --wait) in flight on one connection, and subscriptions on one.
    max_waits: int = 256
    max_subscriptions: int = 32
    # How often the server looks for connections past a deadline.
    sweep_s: float = 1.0

    @property
    def max_unsent(self) -> int:
        return self.write_high + self.max_reply
