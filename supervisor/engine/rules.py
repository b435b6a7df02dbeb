"""``yield_when`` rules: yield a GPU by itself while a given program runs (``config.yaml``).

Each rule is a process name (the GPU it holds memory on is yielded while it runs there, and
resumed once it left), or a command whose exit code decides (0: yield; its ``gpus``, else every
GPU), run every ``every`` with a ``timeout``: a command that hangs is killed at its timeout,
said once, and counts as "no"; whatever a command leaves running once it has answered is
killed with it (its whole process group) — nothing sticks::

    engine:
      yield_when:
        - steam                         # a process name, as the system shows it
        - blender
        - command: pgrep -x darktable   # exit 0: yield
          timeout: 2s                   # (default 5s)
          every: 5s                     # (default 5s)
          gpus: [0]                     # (default: every GPU)
      reserve:                          # per GPU, always kept free (default: 256MiB each)
        0: 2GiB

:func:`parse_rules` turns the YAML into :class:`YieldRule` s (one line for a bad one);
:class:`Rules` keeps what the commands answered last and says which GPUs the rules want yielded
now (:meth:`Rules.wanted`); the engine yields and resumes through the same methods as a person
(:mod:`.yielding`, marked ``rule``), and never resumes a GPU a person yielded.

A process name is followed with the strangers' durations (``EngineConfig.others_arrive_s`` /
``others_leave_s``) but a rule of its own, on presence rather than memory: the program must be
seen on a GPU for ``arrive_s`` without a break before its rule yields it, and be gone for
``leave_s`` before the rule resumes it, so that a program that comes and goes briefly does not
cost a model reload each time. (``scheduler/strangers.py`` follows what strangers hold, by
the lowest and highest readings over windows of those lengths.)

A person overrides a rule: a GPU a person resumes (:meth:`Rules.waive`) is not yielded again by
the rules that wanted it then, for as long as what they saw goes on; a rule yields it again
only once its condition has ended (its program gone for ``leave_s``, its command answered no)
and begun anew. What a person waived outlives an engine restart (:meth:`Rules.waivers`, kept
in the yields file by :mod:`.yielding`, and :meth:`Rules.restore`): the condition that went on
goes on being waived until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.clock import monotonic

from ..errors import VramtuiError
from ..scheduler.strangers import ARRIVE_S, EPS, LEAVE_S
from ..units import parse_duration

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_EVERY_S = 5.0
MAX_RULES = 32


class BadRule(VramtuiError):
    """A ``yield_when`` rule that cannot be used."""


@dataclass(frozen=True, slots=True)
class YieldRule:
    """One rule: a process ``name``, or a ``command`` (argv) with its timing and GPUs."""

    name: str | None = None
    command: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    every_s: float = DEFAULT_EVERY_S
    gpus: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        return f"while {self.name} runs" if self.name else f"while `{shlex.join(self.command)}`"


def parse_rules(raw: Any, where: str) -> tuple[YieldRule, ...]:
    """The rules of ``yield_when:`` (a list); BadRule, one line, naming ``where``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRule(f"{where}: a list of process names or {{command: …}} entries")
    if len(raw) > MAX_RULES:
        raise BadRule(f"{where}: at most {MAX_RULES} rules, not {len(raw)}")
    return tuple(_rule(item, f"{where}[{i}]") for i, item in enumerate(raw))


def _rule(item: Any, where: str) -> YieldRule:
    if isinstance(item, str):
        name = item.strip()
        if not name or len(name) > 255 or "/" in name:
            raise BadRule(f"{where}: a process name like steam (no path), not {item!r}")
        return YieldRule(name=name)
    if not isinstance(item, Mapping) or "command" not in item:
        raise BadRule(f"{where}: a process name, or {{command: …, timeout: 5s, every: 5s, "
                      "gpus: [0]}}")
    unknown = sorted(set(item) - {"command", "timeout", "every", "gpus"})
    if unknown:
        raise BadRule(f"{where}: unknown key {unknown[0]!r} (known: command, timeout, every, "
                      "gpus)")
    command = item["command"]
    try:
        argv = tuple(shlex.split(command)) if isinstance(command, str) else tuple(
            str(a) for a in command)
    except (ValueError, TypeError):
        argv = ()
    if not argv:
        raise BadRule(f"{where}: command: a command line (or a list of its words)")
    if any("\0" in a for a in argv):  # the system would refuse it at every run
        raise BadRule(f"{where}: command: a NUL byte cannot be part of a command line")
    timing = {}
    for key, default in (("timeout", DEFAULT_TIMEOUT_S), ("every", DEFAULT_EVERY_S)):
        try:
            # (infinite, or past parse_duration's 10 years: refused by the range below)
            timing[key] = parse_duration(item.get(key, default), allow_infinite=True)
        except ValueError as exc:
            raise BadRule(f"{where}: {key}: {exc}") from None
        if not 0.1 <= timing[key] <= 3600:
            raise BadRule(f"{where}: {key}: between 0.1s and 1h")
    gpus = item.get("gpus")
    if gpus is not None and (not isinstance(gpus, list) or not all(
            isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)):
        raise BadRule(f"{where}: gpus: a list of GPU indexes like [0, 1]")
    return YieldRule(command=argv, timeout_s=timing["timeout"], every_s=timing["every"],
                     gpus=None if gpus is None else tuple(gpus))


@dataclass(slots=True)
class _Presence:
    """A name rule on one GPU: whether it counts its program as there (``on``), since when
    it has been seen otherwise without a break (None: as counted), and whether a person
    resumed the GPU while it was there (``waived``: not yielded again until it has left)."""

    on: bool
    since: float | None = None
    waived: bool = False


class Rules:
    """What the rules want now (see the module doc)."""

    def __init__(self, rules: Sequence[YieldRule], note: Callable[..., None],
                 own: Callable[[int], None] = lambda pid: None, *,
                 arrive_s: float = ARRIVE_S, leave_s: float = LEAVE_S,
                 clock: Callable[[], float] = monotonic) -> None:
        self.rules = tuple(rules)
        self.by_name = any(r.name is not None for r in self.rules)  # reads programs' names
        self.note = note
        self.own = own  # told each command's pid: the engine's own, on no device
        self.arrive_s, self.leave_s, self.clock = arrive_s, leave_s, clock
        self.answers: dict[int, bool] = {}  # command rule's index -> its last answer
        self._said: set[int] = set()  # command rules whose trouble was said (once each)
        self._presence: dict[tuple[int, int], _Presence] = {}  # (name rule, GPU) -> state
        self._waived: set[tuple[int, int]] = set()  # (command rule, GPU) a person resumed

    @property
    def following(self) -> bool:
        """Whether a name rule follows a visit of its program now (seen, and not yet gone
        for ``leave_s``)."""
        return bool(self._presence)

    def observe(self, names: Mapping[int, Iterable[str]], present: Iterable[int],
                held: Mapping[int, Any]) -> None:
        """Take in which programs are on each GPU now (``names``: GPU -> the names of the
        processes on it that are not ours), with hysteresis (see the module doc). A yield
        of a rule found in ``held`` (kept over a restart) counts its program as there: it is
        resumed only once the program has been seen gone for ``leave_s``."""
        now = self.clock()
        gpus = sorted(present)
        seen = {g: set(names.get(g, ())) for g in gpus}
        for i, rule in enumerate(self.rules):
            if rule.name is None:
                continue
            for g in gpus:
                there = rule.name in seen[g]
                state = self._presence.get((i, g))
                if state is None:
                    y = held.get(g)
                    kept = y is not None and y.rule and y.by == rule.label
                    if not there and not kept:
                        continue
                    state = self._presence[(i, g)] = _Presence(kept)
                if there == state.on:
                    state.since = None
                else:
                    if state.since is None:
                        state.since = now
                    if now - state.since >= (self.arrive_s if there else self.leave_s) - EPS:
                        state.on, state.since = there, None
                if not state.on and state.since is None:
                    del self._presence[(i, g)]

    def wanted(self, present: Iterable[int]) -> dict[int, str]:
        """GPU -> the first rule that wants it yielded now (as last observed)."""
        gpus = sorted(present)
        out: dict[int, str] = {}
        for i, rule in enumerate(self.rules):
            if rule.name is not None:
                for g in gpus:
                    state = self._presence.get((i, g))
                    if state is not None and state.on and not state.waived:
                        out.setdefault(g, rule.label)
            elif self.answers.get(i):
                for g in rule.gpus if rule.gpus is not None else gpus:
                    if g in gpus and (i, g) not in self._waived:
                        out.setdefault(g, rule.label)
        return out

    def waive(self, gpu: int, by: str | None = None) -> list[str]:
        """A person resumed ``gpu`` (``by``: the rule that had yielded it, if one had): the
        rules that want it now do not yield it again before their condition has ended and
        begun anew. The labels of the rules waived."""
        out = []
        for i, rule in enumerate(self.rules):
            if rule.name is not None:
                state = self._presence.get((i, gpu))
                if state is None and by == rule.label:  # kept over a restart, not seen yet
                    state = self._presence[(i, gpu)] = _Presence(True)
                if state is None or not state.on or state.waived:
                    continue
                state.waived = True
            else:
                answer = self.answers.get(i)
                if answer is False or (answer is None and by != rule.label) or \
                        (rule.gpus is not None and gpu not in rule.gpus) or \
                        (i, gpu) in self._waived:
                    continue
                self._waived.add((i, gpu))
            out.append(rule.label)
        return out

    def waivers(self) -> dict[int, tuple[str, ...]]:
        """GPU -> the labels of the rules a person waived there, as they stand now."""
        out: dict[int, list[str]] = {}
        for (i, g), state in self._presence.items():
            if state.waived:
                out.setdefault(g, []).append(self.rules[i].label)
        for i, g in self._waived:
            out.setdefault(g, []).append(self.rules[i].label)
        return {g: tuple(sorted(labels)) for g, labels in sorted(out.items())}

    def restore(self, waived: Mapping[int, Iterable[str]]) -> None:
        """Take back the waivers of an engine before a restart (:meth:`waivers`): a name
        rule's program counts as there, waived, until it has been gone for ``leave_s``; a
        command rule stays waived until it answers no. Labels of rules no longer configured
        are dropped."""
        for g, labels in waived.items():
            for i, rule in enumerate(self.rules):
                if rule.label not in labels:
                    continue
                if rule.name is not None:
                    self._presence[(i, g)] = _Presence(True, waived=True)
                else:
                    self._waived.add((i, g))

    def answered(self, index: int, yes: bool | None) -> None:
        """Command rule ``index`` answered ``yes``; None: it gave no answer (it could not
        run, or timed out), which counts as no but does not end what a person waived of it
        (only a real "no" does: the condition ended)."""
        self.answers[index] = bool(yes)
        if yes is False:
            self._waived = {(i, g) for i, g in self._waived if i != index}

    def follow(self, strangers: Mapping[int, Iterable[Any]], present: Iterable[int],
               held: Mapping[int, Any], give: Callable[..., Any],
               take_back: Callable[[list[int]], Any]) -> None:
        """Yield (``give``) what the rules want and is not yielded yet; resume (``take_back``)
        what a rule yielded and no rule wants any more (a person's yield is never touched)."""
        here = set(present)
        self.observe({g: [s.name for s in ss] for g, ss in strangers.items()}, here, held)
        wanted = self.wanted(here)
        for g, why in wanted.items():
            if g not in held:
                give([g], by=why, rule=True)
        # A command that has not answered yet (the engine just started, a yield of it kept
        # from before) may still want its GPUs: they are not resumed before it says no.
        unknown = {g for i, r in enumerate(self.rules) if r.command and i not in self.answers
                   for g in (r.gpus if r.gpus is not None else held)}
        # (a GPU no longer there cannot be resumed: take_back would refuse, in the ticker)
        gone = [g for g, y in held.items() if y.rule and g in here and g not in wanted
                and g not in unknown]
        if gone:
            take_back(gone)

    async def watch_commands(self) -> None:
        """Run each command rule every ``every`` (on the engine loop, until cancelled)."""
        commands = [(i, r) for i, r in enumerate(self.rules) if r.command]
        if not commands:
            return
        await asyncio.gather(*(self._watch(i, r) for i, r in commands))

    async def _watch(self, index: int, rule: YieldRule) -> None:
        while True:
            self.answered(index, await self.ask(index, rule))
            await asyncio.sleep(rule.every_s)

    async def ask(self, index: int, rule: YieldRule) -> bool | None:
        """Run the rule's command once: True when it exits 0 within its timeout, False when
        it exits otherwise; None when it gave no answer (it could not run, or timed out)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *rule.command, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True)
        except OSError as exc:
            self._trouble(index, f"yield_when: cannot run `{shlex.join(rule.command)}`: "
                          f"{exc.strerror or exc}; the rule counts as no")
            return None
        self.own(proc.pid)
        try:
            code = await asyncio.wait_for(proc.wait(), rule.timeout_s)
        except asyncio.CancelledError:  # the engine stops: the command must not outlive it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: children too
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                await asyncio.wait_for(proc.wait(), 1.0)
            self._trouble(index, f"yield_when: `{shlex.join(rule.command)}` did not answer "
                          f"within {rule.timeout_s:g} s (killed); the rule counts as no")
            return None
        # What it left behind in its session (``sh -c 'x & exit 1'``) would pile up at every
        # run and outlive the engine: its answer is its exit code, the rest goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._said.discard(index)
        return code == 0

    def _trouble(self, index: int, text: str) -> None:
        if index not in self._said:
            self._said.add(index)
            self.note("warning", text)
        log.debug(text)
