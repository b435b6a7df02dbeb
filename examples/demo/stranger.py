"""A program the engine does not manage, taking memory on the simulated GPU (a game, Blender).

It is not a worker: a plain process that declares memory through ``worker_sdk.sim`` the way a
real program holds CUDA memory, so the engine sees it as a stranger on the device::

    python examples/demo/stranger.py 10GiB                 # until Enter (or Ctrl-C)
    python examples/demo/stranger.py 10GiB --for 5s --gpu 1

The ledger directory is ``$VRAMTUI_SIM_DIR`` or, by default, the engine's (``simgpu`` in its
runtime directory).  It prints ``holding <MiB> MiB on GPU<i> (pid <pid>)`` once the memory is
declared, and lets it go when it leaves.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from supervisor.paths import Paths
    from supervisor.units import parse_duration, parse_size
    from worker_sdk import sim

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", help="memory to take: 10GiB, 512MiB, or MiB")
    parser.add_argument("--gpu", type=int, default=0, help="simulated GPU index (0)")
    parser.add_argument("--for", dest="duration", help="leave after this long (5s, 1m)")
    args = parser.parse_args(argv)
    try:
        mib = parse_size(args.size)
        duration = parse_duration(args.duration) if args.duration else None
    except ValueError as exc:
        print(f"stranger: {exc}", file=sys.stderr)
        return 2
    os.environ.setdefault(sim.ENV_DIR, str(Paths.from_env().sim_dir))
    os.environ[sim.ENV_GPU] = str(args.gpu)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sim.allocate(mib)
    print(f"holding {mib} MiB on GPU{args.gpu} (pid {os.getpid()})", flush=True)
    try:
        if duration is not None:
            time.sleep(duration)
        else:
            sys.stdin.readline()
    except KeyboardInterrupt:
        pass
    finally:
        sim.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
