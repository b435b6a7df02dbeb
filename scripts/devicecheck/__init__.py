"""``scripts/device-check``: one prepared run that proves vramtui's real-GPU path on a card.

Two halves, so that the part that runs first needs nothing but the standard library:

- run by the system ``python3`` (standard library only): ``main`` (arguments, the order of the
  steps, their time limits, the log, the table, the exit code), ``detect`` (is there an
  NVIDIA GPU: NVML through ctypes, in a child process), ``environment`` (the fresh venv, or
  the one given), ``plan`` (the sizes and the backends file), ``table`` (rows and their
  rendering), ``compare`` (the tolerances);
- run by the venv's Python, one child process per stage: ``stages`` (doctor, probe, engine:
  calibrate + trace + screenshot), ``readers`` (NVML or the simulated GPU, read
  independently of the engine), ``watcher`` (the ≥ 20 Hz memory watcher), ``shot`` (the
  dashboard screenshot, attached to the running engine).

For a session lent a GPU machine with no network (CPython 3.12 there): here, in the repository,
``scripts/device-check --prepare-wheels .whl`` (about 5 MiB, ignored by git), then one device
run carrying it, e.g. ``scripts/device-check --wheels .whl`` with ``carry: [".whl"]`` and a time
limit of 420 s; the results come back from ``$OUT``.  ``--stages trace`` (or any list) reruns
part of it.
"""
