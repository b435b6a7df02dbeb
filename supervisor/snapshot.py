"""Immutable views of the whole engine at one instant, for the TUI, the CLI and tests."""

from __future__ import annotations

from dataclasses import dataclass

from .jobs import JobView

KIND_LABELS = {"simulated": "SIMULATED", "host": "host memory"}  # the rest: a real GPU's


def kind_label(source: str) -> str:
    """How figures read from ``source`` are labelled: ``SIMULATED``, ``host memory``, or
    ``GPU`` (NVML): the one place that says it."""
    return KIND_LABELS.get(source, "GPU")


def device_label(source: str, index: int | None) -> str:
    """``nvml GPU 0``, ``simulated GPU 1``, or ``host memory (device 2)``: a device named by
    what measures it."""
    if source == "host":
        return "host memory" + (f" (device {index})" if index is not None else "")
    return f"{source} GPU" + (f" {index}" if index is not None else "")


@dataclass(frozen=True, slots=True)
class LogLine:
    t: float
    level: str
    text: str
    backend: str | None = None


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU: one of our workers (``backend``) or foreign."""

    pid: int
    used_mib: int | None  # None: the driver would not say
    user: str  # "?" when it cannot be read
    backend: str | None  # None: not ours ("foreign")
    name: str = ""  # the process's name, where the system gives it ("?" when it cannot)


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    name: str
    total_mib: int
    used_mib: int | None  # what the device reports (None: not available)
    free_mib: int | None
    reserved_mib: int  # what the ledger says our workers hold (and stopped ones not yet gone)
    ours_mib: int  # what our workers' processes were seen to use
    foreign_mib: int | None  # used by processes that are not ours
    util_pct: int | None
    temp_c: int | None
    power_w: float | None
    simulated: bool
    reserve_mib: int
    history: tuple[tuple[float, int], ...]  # (wall-clock t, used MiB)
    draining: bool = False  # admits nothing new; its idle workers are evicted
    processes: tuple[GpuProcess, ...] = ()  # at the last process sample, largest first
    others_mib: int = 0  # what admission holds back for strangers (with hysteresis)
    yielded_by: str | None = None  # handed over (vramtui yield): who asked; None: not yielded
    yielded_until: float | None = None  # epoch seconds (None: until resumed)
    yielded_rule: bool = False  # a yield_when rule yielded it: until its program leaves
    source: str = "nvml"  # what measures it: "nvml", "simulated", or "host" (host memory)
    # What admission may still hand out here now: the ledger's budget (what others are
    # counted at, hysteresis and all), 0 while it is yielded or draining.
    budget_mib: int = 0

    @property
    def yielded_text(self) -> str:
        """``yielded to ada (cli) until 14:05:09`` (or ``until resumed``); a rule's:
        ``yielded while steam runs (rule), or until resumed``; "" when open."""
        if self.yielded_by is None:
            return ""
        if self.yielded_rule:
            return f"yielded {self.yielded_by} (rule), or until resumed"
        if self.yielded_until is None:
            return f"yielded to {self.yielded_by} until resumed"
        from .units import wall_time_text

        return f"yielded to {self.yielded_by} until {wall_time_text(self.yielded_until)}"

    @property
    def strangers(self) -> tuple[GpuProcess, ...]:
        """The processes here that are not ours, largest first."""
        return tuple(p for p in self.processes if p.backend is None)

    @property
    def host(self) -> bool:
        """The host device (``--gpus host``): its figures are host memory, read from /proc."""
        return self.source == "host"

    @property
    def kind(self) -> str:
        """How its figures are labelled: ``SIMULATED``, ``host memory`` or ``GPU``."""
        return kind_label("simulated" if self.simulated else self.source)



@dataclass(frozen=True, slots=True)
class BackendView:
    name: str
    state: str
    pid: int | None
    gpu: int | None
    observed_mib: int | None
    declared_peak_mib: int | None
    learned_peak_mib: int | None
    observed_p95_mib: int | None
    reserved_mib: int
    priority: int
    jobs_served: int
    last_used: float | None
    keep_alive_left_s: float | None
    last_error: str | None
    init_failures: int
    queued: int
    running: int
    description: str
    log_path: str
    pinned: bool
    simulated: bool
    source: str
    features: tuple[str, ...]
    learned_resident_mib: int | None = None
    admission_peak_mib: int | None = None  # what admission sizes it by (declared or learned)
    over_mib: int = 0  # how far its worker was last seen above its figures
    accepting: bool = True  # False: its worker takes no new job and is evicted once idle
    on_overuse: str = "evict"
    reload_cost_s: float | None = None  # learned from measured start-to-ready times
    job_s: float | None = None  # what a job of it takes, expected (its measured runs; None: none)
    distrusted: bool = False  # caught lying: its descriptor only a floor, measured first
    can_sleep: bool = False  # its worker may be put to sleep rather than stopped
    sleep_residual_mib: int | None = None  # what it kept on its GPU asleep, measured
    wake_cost_s: float | None = None  # what admission counts a wake at (measured, else prior)
    no_sleep: str | None = None  # why it is no longer put to sleep (until respawned)
    api: tuple[str, ...] = ()  # the API shapes an HTTP front serves it as (``api:``)
    tunnels: int = 0  # websockets open through /upstream to its server (they hold it)

    @property
    def held(self) -> str:
        """What holds it loaded besides its jobs: ``2 websockets`` (or "")."""
        if not self.tunnels:
            return ""
        return f"{self.tunnels} websocket" + ("s" if self.tunnels > 1 else "")

    @property
    def peak_mib(self) -> int | None:
        return self.declared_peak_mib if self.declared_peak_mib is not None \
            else self.learned_peak_mib

    @property
    def over_declared(self) -> bool:
        """The observed p95 peak is above the declared peak (the descriptor is wrong)."""
        return (self.declared_peak_mib is not None and self.observed_p95_mib is not None
                and self.observed_p95_mib > self.declared_peak_mib)


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    taken_at: float
    uptime_s: float
    source: str
    simulated: bool
    driver_version: str | None
    notice: str | None
    gpus: tuple[GpuView, ...]
    backends: tuple[BackendView, ...]
    running: tuple[JobView, ...]
    queued: tuple[JobView, ...]
    recent: tuple[JobView, ...]
    descriptor_errors: tuple[str, ...]
    log: tuple[LogLine, ...]
    stopping: bool
    pid: int
    python: str

    def backend(self, name: str) -> BackendView | None:
        return next((b for b in self.backends if b.name == name), None)
