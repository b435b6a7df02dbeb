"""A model server's first process: it starts the server and reaps whatever the server leaves.

Run as ``python -I -S reaper.py`` by :func:`supervisor.workers.process.spawn` (``reaped``),
the standard library only, and no site. It is handed its command in its environment, out of
its command line (a ``pkill -f`` of the server does not match it): ``VRAMTUI_REAPER_ARGC``
and each word as ``VRAMTUI_REAPER_ARG_<i>``, and every variable of the command's environment
under the prefix ``VRAMTUI_REAPED_`` (so none of them configures this process's Python: not
``LD_LIBRARY_PATH``, which outranks its RUNPATH, nor a locale it would coerce), which it
gives back to the command exactly as they were, and nothing else.

It makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``) and starts the
command as its child, in this process's group (the one the engine signals), so every
process of the server's tree that is orphaned (a daemon that forked twice, left its session
with ``setsid -f`` and cleared its environment with ``env -i``: nothing of it names the
server any more) is adopted by this process instead of init, and stays in the tree the
engine walks from the worker's pid (``lifeline.strays``: what a signal to the group misses
is found, and killed with the server). Its name (``/proc/PID/comm``) says the command's
pid: ``reaper <pid>``.

A signal sent to the group reaches the command as it is; this process does not die of it
(it handles every signal that would end it but SIGKILL and its own faults), and passes it
on to the command only when the command has left the group (it called ``setsid``: the
group's signal missed it). The command starts with every signal at its default (as an exec
from the engine did).
Once the command has exited, what is left of its tree is killed (SIGKILL: the server is
gone, its helpers go with it), and this process exits as the command did (its code, or its
signal raised again). Where a subreaper cannot be had (not Linux), it runs the command in
its own place (``exec``). A command that cannot be started is said in one line on stderr
(the backend's log), and it exits 127, as a shell does.

When the process that started it dies (the engine, ``VRAMTUI_REAPER_PARENT``: killed with
``kill -9`` together with its lifeline, say), the kernel tells it (``PR_SET_PDEATHSIG``) and
it kills the command and everything it adopted, then exits: nothing of the server outlives
the engine, whoever watches or not.

If this process is killed itself (SIGKILL to its pid alone), what it adopted goes to init:
the engine kills the server's group, and a daemon that left both the group and its mark is
not found any more.
"""

import contextlib
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
ENV_PREFIX = "VRAMTUI_REAPED_"
ARGC = "VRAMTUI_REAPER_ARGC"
ARG = "VRAMTUI_REAPER_ARG_"
PARENT = "VRAMTUI_REAPER_PARENT"  # the pid of the process whose death ends the tree
#: The signal the kernel sends when that parent dies (one nobody sends a server's group).
PARENT_GONE = signal.SIGRTMIN + 3
#: Signals left at their default here: those that do not end a process, those that cannot be
#: handled, and the faults of this process's own (a handler that returns to the faulting
#: instruction would loop).
NOT_HANDLED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT, signal.SIGTSTP,
               signal.SIGTTIN, signal.SIGTTOU, signal.SIGWINCH, signal.SIGURG, signal.SIGSEGV,
               signal.SIGBUS, signal.SIGILL, signal.SIGFPE}

_child: int | None = None
_pending: list[int] = []  # signals that came before the command was started
_parent: int | None = None


def _prctl(option: int, value: object) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError, ImportError, TypeError):
        return False


def _command() -> tuple[list[str], dict[str, str]]:
    env = os.environ
    try:
        args = [env[f"{ARG}{i}"] for i in range(int(env[ARGC]))]
    except (KeyError, ValueError):
        args = []
    return args, {k[len(ENV_PREFIX):]: v for k, v in env.items() if k.startswith(ENV_PREFIX)}


def _pass_on(sig: int, _frame: object = None) -> None:
    """A signal this process must not die of: the command's, if the group's missed it."""
    if _child is None:
        _pending.append(sig)
        return
    with contextlib.suppress(OSError):
        if os.getpgid(_child) != os.getpgrp():
            os.kill(_child, sig)


def _parent_gone(sig: int, frame: object = None) -> None:
    """The process that started this one died (or someone sent its signal: then it is passed
    on as any other): the command and its tree are killed, and this process exits."""
    if _parent is None or os.getppid() == _parent:
        _pass_on(sig, frame)
        return
    _kill_the_rest()  # (the command first among them, once it is started)
    os._exit(1)


def _spawn(args: list[str], env: dict[str, str]) -> int:
    """Fork and exec the command (found in its own PATH, a relative entry from the cwd), every
    signal at its default in it; the exec's error raised here (as subprocess reports it).
    Not posix_spawn: it would leave the C library's own signals ignored in the command."""
    read_end, write_end = os.pipe()  # (both close on exec)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, signal.SIG_DFL)
            os.execvpe(args[0], args, env)
        except OSError as exc:
            os.write(write_end, str(exc.errno or 0).encode())
        finally:
            os._exit(127)
    os.close(write_end)
    said = b""
    while chunk := os.read(read_end, 32):
        said += chunk
    os.close(read_end)
    if said:
        os.waitpid(pid, 0)
        code = int(said)
        raise OSError(code, os.strerror(code))
    return pid


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


def _cannot_start(program: str, exc: OSError) -> None:
    sys.stderr.write(f"cannot start {program!r}: {exc.strerror}\n")
    sys.stderr.flush()
    os._exit(127)


def _watch_parent() -> None:
    """Hear of the death of the process that started this one; gone already: exit."""
    global _parent
    with contextlib.suppress(KeyError, ValueError):
        _parent = int(os.environ[PARENT])
    if _parent is None:
        return
    signal.signal(PARENT_GONE, _parent_gone)
    if _prctl(PR_SET_PDEATHSIG, int(PARENT_GONE)) and os.getppid() != _parent:
        os._exit(1)  # (it died before it could be watched: nothing was started)


def main() -> None:
    global _child
    args, env = _command()
    if not args:
        sys.stderr.write(f"reaper.py: no command ({ARGC} and {ARG}<i> name it)\n")
        os._exit(2)
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        try:
            os.execvpe(args[0], args, env)
        except OSError as exc:
            _cannot_start(args[0], exc)
    for sig in signal.valid_signals() - NOT_HANDLED:
        with contextlib.suppress(OSError, ValueError):  # (those the C library keeps)
            signal.signal(sig, _pass_on)
    _watch_parent()
    try:
        child = _spawn(args, env)
    except OSError as exc:
        _cannot_start(args[0], exc)
    _child = child
    _prctl(PR_SET_NAME, f"reaper {child}".encode())
    for sig in _pending:  # (sent to the group before the command was in it)
        with contextlib.suppress(OSError):
            os.kill(child, sig)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # (it cannot be: the command is a child until it is reaped)
            os._exit(0)
        if pid == child:
            _kill_the_rest()
            _end_as(status)


if __name__ == "__main__":
    main()
