"""A model server's first process: it starts the server and reaps whatever the server leaves.

Run as ``python -I -S reaper.py -- COMMAND [ARGS...]`` (:func:`supervisor.workers.process.spawn`
with ``reaped``); the standard library only, and no site (the server's environment is not
the engine's Python's). It makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``)
and starts the command as its child, in its own process group, so every process of the
server's tree that is orphaned — a daemon that forked twice, left its session (``setsid
-f``) and cleared its environment (``env -i``): nothing of it names the server any more — is
adopted by this process instead of init, and stays in the tree the engine walks from the
worker's pid (``lifeline.strays``: what a signal to the group misses is found, and killed
with the server). It ignores SIGTERM, SIGINT and SIGHUP itself (the command gets them, as the
whole group does) and waits: once the command has exited, what is left of its tree is
killed (SIGKILL: the server is gone, its helpers go with it), and this process exits as the
command did (its code, or its signal, raised again). Where a subreaper cannot be had (not
Linux), it runs the command in its own place (``exec``): as without it.

A command that cannot be started (not found, not executable, not a program) is said in one
line on stderr (the backend's log) and exits 127, as a shell says it.
"""

import contextlib
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: The command's dynamic loader variables (``LD_*``) come under this prefix (not to load
#: this process's Python from the command's library path): given back as they were.
LOADER_PREFIX = "VRAMTUI_REAPED_"


def _command_env() -> dict[str, str]:
    env = {}
    for key, value in os.environ.items():
        env[key[len(LOADER_PREFIX):] if key.startswith(LOADER_PREFIX) else key] = value
    return env


def _subreaper() -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError, ImportError):
        return False


def _children() -> list[int]:
    """This process's children now (those it adopted included)."""
    me = os.getpid()
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{task}/children") as f:
                found.extend(int(p) for p in f.read().split())
        return found
    except (OSError, ValueError):
        pass
    for entry in os.listdir("/proc"):  # (a kernel without the children file)
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
            if int(data[data.rindex(b")") + 2:].split()[1]) == me:
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _kill_the_rest() -> None:
    """SIGKILL every child until none is left (a killed one's children are adopted in turn)."""
    while True:
        for pid in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _end_as(status: int) -> None:
    """Exit as the command ended: its exit code, or its signal raised on this process."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(ImportError, ValueError, OSError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # (its core, not ours)
        with contextlib.suppress(ValueError, OSError):  # (SIGKILL's cannot be set)
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # (a signal that does not end a process by default)
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str]) -> None:
    args = argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.stderr.write("usage: reaper.py -- COMMAND [ARGS...]\n")
        os._exit(2)
    env = _command_env()
    if not _subreaper():
        try:
            os.execvpe(args[0], args, env)
        except OSError as exc:
            sys.stderr.write(f"cannot start {args[0]!r}: {exc.strerror}\n")
            os._exit(127)
    for sig in PASSED_ON:
        signal.signal(sig, signal.SIG_IGN)
    try:
        child = os.posix_spawnp(args[0], args, env, setsigdef=PASSED_ON)
    except OSError as exc:
        sys.stderr.write(f"cannot start {args[0]!r}: {exc.strerror}\n")
        os._exit(127)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # (it cannot be: the command is a child until it is reaped)
            os._exit(0)
        if pid == child:
            _kill_the_rest()
            _end_as(status)


if __name__ == "__main__":
    main(sys.argv)
