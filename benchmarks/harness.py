"""The shared benchmark harness: timing, CUDA graphs, peak memory, JSON and markdown.

Method (docs: /work/shared/performance.md, docs/benchmarks.md):

- Every candidate of a cell (seqkernels and its peers) is timed in the same process, on
  the same device, in the same run, **interleaved**: each round calls every candidate once,
  in an order that rotates from round to round, so that a slow drift of the machine (heat,
  another process) falls on all of them alike.
- Warm-up calls first (they build caches, pick algorithms, fault pages in), then at least
  ``MIN_TIMED_CALLS`` timed calls; the figure reported is the median.
- On a GPU each call is timed with a pair of CUDA events recorded on the current stream
  after a ``torch.cuda.synchronize()``; the host launch cost of an eager call is part of
  what the events see, as it is part of what a user waits for. On the CPU each call is
  timed with ``time.perf_counter``.
- ``capture_cuda_graph`` captures a callable into a CUDA graph (warm-up on a side stream,
  then capture) and returns the replay; ``peak_memory_bytes`` measures the peak allocated
  by one call above what was allocated before it.

Nothing here knows about LSTMs: one script per cell (``bench_<cell>.py``) builds the
callables and the records.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Callable, Iterable, Mapping, Sequence

import torch

MIN_TIMED_CALLS = 20


# --------------------------------------------------------------------------------------
# Machine description
# --------------------------------------------------------------------------------------
def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags(wanted: Iterable[str] = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile")) -> list[str]:
    """The subset of ``wanted`` ISA flags this CPU reports (x86 Linux; [] elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def tf32_state() -> dict:
    """The two TF32 switches that matter for float32 on NVIDIA GPUs, as they are now."""
    return {
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
    }


def set_tf32(enabled: bool | None) -> None:
    """``None``: PyTorch's defaults (cuDNN TF32 on, cuBLAS matmul TF32 off).
    ``False``: TF32 off for cuDNN and for cuBLAS matmuls (both sides of a comparison).
    ``True``: TF32 on for both."""
    if enabled is None:
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        torch.backends.cudnn.allow_tf32 = enabled
        torch.backends.cuda.matmul.allow_tf32 = enabled


def environment(device: torch.device) -> dict:
    """What every record carries about the machine and the software."""
    env = {
        "device": device.type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "date": _dt.date.today().isoformat(),
        "cpu_count": os.cpu_count(),
    }
    if device.type == "cpu":
        env["cpu_flags"] = cpu_flags()
        env["mkldnn"] = torch.backends.mkldnn.is_available()
    else:
        props = torch.cuda.get_device_properties(device)
        env["sm_count"] = props.multi_processor_count
        env["capability"] = f"{props.major}.{props.minor}"
        env["cudnn"] = torch.backends.cudnn.version()
    return env


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return None


class OtherLoad:
    """How many CPU cores *other* processes kept busy while a cell ran (Linux).

    /proc/stat's busy time of the whole machine minus this process's own CPU time, over
    the wall time. On a small machine anything well above 0 means the timings of the cell
    were taken while something else competed for the cores (a build, another benchmark).
    """

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.busy0 = self._machine_busy_s()
        self.self0 = self._self_cpu_s()

    @staticmethod
    def _machine_busy_s() -> float | None:
        try:
            with open("/proc/stat", encoding="utf-8") as f:
                vals = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        idle = vals[3] + vals[4]  # idle + iowait
        return (sum(vals) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _self_cpu_s() -> float:
        t = os.times()
        return t.user + t.system

    def cores(self) -> float | None:
        busy1 = self._machine_busy_s()
        if busy1 is None or self.busy0 is None:
            return None
        wall = time.perf_counter() - self.t0
        other = (busy1 - self.busy0) - (self._self_cpu_s() - self.self0)
        return max(0.0, other / wall) if wall > 0 else None


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Timing:
    """The timed calls of one candidate, in milliseconds."""

    samples_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def iqr_ms(self) -> float:
        q = statistics.quantiles(self.samples_ms, n=4)
        return q[2] - q[0]

    def summary(self) -> dict:
        return {
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "iqr_ms": self.iqr_ms,
            "calls": len(self.samples_ms),
        }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_interleaved(
    fns: Mapping[str, Callable[[], object]],
    device: torch.device,
    *,
    warmup: int = 3,
    iters: int = MIN_TIMED_CALLS,
    before_each: Callable[[], None] | None = None,
) -> dict[str, Timing]:
    """Times each callable ``iters`` times after ``warmup`` untimed calls, interleaved.

    Round r calls the candidates in the order rotated by r. ``before_each`` (untimed) runs
    before every call, e.g. to clear gradients.
    """
    if iters < MIN_TIMED_CALLS:
        raise ValueError(f"at least {MIN_TIMED_CALLS} timed calls are needed, got {iters}")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            if before_each is not None:
                before_each()
            fns[name]()
    synchronize(device)

    samples: dict[str, list[float]] = {name: [] for name in names}
    cuda = device.type == "cuda"
    for r in range(iters):
        order = names[r % len(names):] + names[: r % len(names)]
        events = []
        for name in order:
            if before_each is not None:
                before_each()
            fn = fns[name]
            if cuda:
                torch.cuda.synchronize(device)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                events.append((name, start, end))
            else:
                t0 = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - t0) * 1e3)
        if cuda:
            torch.cuda.synchronize(device)
            for name, start, end in events:
                samples[name].append(start.elapsed_time(end))
    return {name: Timing(s) for name, s in samples.items()}


# --------------------------------------------------------------------------------------
# CUDA graphs and memory
# --------------------------------------------------------------------------------------
class CapturedGraph:
    """A callable captured into a CUDA graph. ``replay()`` reruns it on the tensors it was
    captured with (static inputs: copy new data into them to change the input);
    ``output`` is what the captured call returned, overwritten by every replay."""

    def __init__(self, graph: "torch.cuda.CUDAGraph", output: object, pool: object):
        self.graph = graph
        self.output = output
        self.pool = pool

    def replay(self) -> object:
        self.graph.replay()
        return self.output

    __call__ = replay


def capture_cuda_graph(fn: Callable[[], object], *, warmup: int = 3, no_grad: bool = True) -> CapturedGraph:
    """Captures ``fn()`` into a CUDA graph the way the PyTorch docs prescribe: warm-up
    calls on a side stream (cuDNN/cuBLAS pick algorithms and workspaces there, outside the
    capture), then the capture itself; under ``torch.no_grad()`` by default (inference)."""
    grad_ctx = torch.no_grad if no_grad else torch.enable_grad
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with grad_ctx(), torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    with grad_ctx(), torch.cuda.graph(graph, pool=pool):
        output = fn()
    torch.cuda.synchronize()
    return CapturedGraph(graph, output, pool)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device, before: Callable[[], None] | None = None) -> int | None:
    """Peak bytes allocated by one call of ``fn`` above what was allocated before it
    (``torch.cuda.max_memory_allocated`` delta); ``None`` on the CPU."""
    if device.type != "cuda":
        return None
    if before is not None:
        before()
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return int(peak)


# --------------------------------------------------------------------------------------
# Output: JSON, markdown, progress
# --------------------------------------------------------------------------------------
def progress(message: str) -> None:
    """One line per cell on stderr (stdout is kept for the table)."""
    print(message, file=sys.stderr, flush=True)


def write_json(path: str, document: dict) -> None:
    """Writes ``document`` to ``path`` atomically (a crash mid-run keeps the last cell)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


@dataclasses.dataclass
class Column:
    header: str
    get: Callable[[dict], object]
    fmt: str = "{}"
    align: str = "right"

    def cell(self, record: dict) -> str:
        try:
            value = self.get(record)
        except (KeyError, TypeError, ZeroDivisionError):
            value = None
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "–"
        if isinstance(value, str):
            return value
        return self.fmt.format(value)


def markdown_table(records: Sequence[dict], columns: Sequence[Column]) -> str:
    """A GitHub markdown table, one row per record."""
    head = "| " + " | ".join(c.header for c in columns) + " |"
    rule = "|" + "|".join("---:" if c.align == "right" else ":---" for c in columns) + "|"
    rows = ["| " + " | ".join(c.cell(r) for c in columns) + " |" for r in records]
    return "\n".join([head, rule, *rows])


def speedup(peer_ms: float | None, ours_ms: float | None) -> float | None:
    if peer_ms is None or ours_ms is None or ours_ms <= 0:
        return None
    return peer_ms / ours_ms


def setup_device(args, suite: str) -> "torch.device":
    """Resolve --device (default: cuda if available), pin it, apply --threads, and fill in
    the warm-up and timed-call defaults (10/50 on a GPU, 3/20 on the CPU) on args."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"{suite}: --device cuda but torch.cuda.is_available() is False")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    elif device.type != "cpu":
        raise SystemExit(f"{suite}: unsupported device {device}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cuda = device.type == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (10 if cuda else 3)
    args.iters = args.iters if args.iters is not None else (50 if cuda else 20)
    return device
