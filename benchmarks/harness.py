"""The shared benchmark harness: timing, CUDA graphs, peak memory, JSON and markdown.

Method (docs: /work/shared/performance.md, docs/benchmarks.md):

- Every candidate of a cell (seqkernels and its peers) is timed in the same process, on
  the same device, in the same run, **interleaved**: each round calls every candidate once,
  in an order that rotates from round to round, so that a slow drift of the machine (heat,
  another process) falls on all of them alike.
- Warm-up calls first (they build caches, pick algorithms, fault pages in), then at least
  ``MIN_TIMED_CALLS`` timed calls; the figure reported is the median.
- Each timed call directly follows an untimed call of the same candidate (``warm_each``;
  ``--no-warm-each`` turns it off): interleaving alone times every call right after a
  different candidate, with that candidate's code and data in the host's caches. On an H200
  host (2026-11-21) that tripled the host cost of a 0.24 ms ConvRNN training call following
  the reference loop's call (1.0 ms), and it falls hardest on the candidate that takes least.
- On a GPU each call is timed with a pair of CUDA events recorded on the current stream
  after a ``torch.cuda.synchronize()``; the events are created before the timed calls (an
  event made on first use inside the timed window added 0.3 ms to the median of that call,
  same host). The host launch cost of an eager call is part of what the events see, as it is
  part of what a user waits for. On the CPU each call is timed with ``time.perf_counter``.
- ``capture_cuda_graph`` captures a callable into a CUDA graph (warm-up on a side stream,
  then capture) and returns the replay; ``peak_memory_bytes`` measures the peak allocated
  by one call above what was allocated before it.

Nothing here knows about LSTMs: one script per cell (``bench_<cell>.py``) builds the
callables and the records; the harness runs the cells (``run_cells``: a progress line per
cell with the time left, the JSON rewritten after every cell), checks correctness
(``rel_errors``, ``check``), times them (``time_candidates``) and writes the output
(``finish``: the markdown table, the JSON, and with ``--plot`` a PNG).

Re-plotting a JSON written earlier (e.g. fetched from a GPU machine) needs no benchmark:

  python benchmarks/harness.py plot bench_results/lstm_cuda.json lstm_cuda.png
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import hashlib
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from typing import Callable, Iterable, Mapping, Sequence

import torch

MIN_TIMED_CALLS = 20
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
# The short dtype names of the diagnostic scripts' DTYPE:B:H cases (scripts/lstm_*.py).
SHORT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Error floors of the correctness checks, relative to max|reference| of each tensor:
# err(seqkernels) <= 2 * err(peer) + floor, both against a float64 reference.
FLOOR = {"float64": 1e-9, "float32": 1e-4, "tf32": 5e-3, "float16": 5e-3, "bfloat16": 3e-2}
TF32_ROWS = {"on": ["on"], "off": ["off"], "both": ["on", "off"]}


def import_seqkernels(script: str):
    """``import seqkernels``, or exit with the reason and how to build it."""
    try:
        import seqkernels
    except ImportError as exc:  # the package raises with the reason when _C is missing
        raise SystemExit(
            f"{script}: cannot import seqkernels ({exc}).\n"
            "Build it first: pip install --no-build-isolation --no-deps -e .  (or bash scripts/bench.sh)"
        ) from exc
    return seqkernels


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


def git_commit(cwd: str | None = None) -> str | None:
    """The short commit hash of the checkout the benchmarks run from (None outside git), with
    "+modified" where tracked files differ from it: then the hash alone would name code that was not
    measured (e.g. a copy of a working tree whose git metadata is older than its files)."""
    cwd = cwd or os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=cwd)
        commit = out.stdout.strip() if out.returncode == 0 else ""
        if not commit:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=30, cwd=cwd)
        return commit + ("+modified" if status.returncode == 0 and status.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def extension_build(seqkernels) -> dict:
    """Which build of seqkernels._C is measured: file, size, modification time, sha256."""
    path = getattr(seqkernels._C, "__file__", None)
    if not path or not os.path.exists(path):
        return {"file": path}
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    mtime = _dt.datetime.fromtimestamp(os.path.getmtime(path), _dt.timezone.utc)
    return {"file": os.path.basename(path), "bytes": os.path.getsize(path),
            "mtime_utc": mtime.isoformat(timespec="seconds"), "sha256_16": digest}


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


def parse_case(text: str) -> tuple[torch.dtype, int, int]:
    """A diagnostic script's case "DTYPE:B:H" (DTYPE one of SHORT_DTYPES) as (dtype, B, H);
    ValueError for anything else."""
    try:
        name, batch, hidden = text.split(":")
        return SHORT_DTYPES[name], int(batch), int(hidden)
    except (KeyError, ValueError):
        raise ValueError(f"{text!r} is not DTYPE:B:H with DTYPE one of {', '.join(SHORT_DTYPES)}") from None


def host_time_us(fn: Callable[[], object], device: torch.device, iters: int = 60) -> float:
    """Median host time of fn() in us: the device drained before each call, not waited for after
    (on a GPU, what the host spends before its launches are queued)."""
    samples = []
    for _ in range(iters):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    synchronize(device)
    return statistics.median(samples)


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
    warm_each: bool = True,
) -> dict[str, Timing]:
    """Times each callable ``iters`` times after ``warmup`` untimed calls, interleaved.

    Round r calls the candidates in the order rotated by r. ``before_each`` (untimed) runs
    before every call, e.g. to clear gradients. With ``warm_each`` every timed call follows
    an untimed call of the same candidate.
    """
    if iters < MIN_TIMED_CALLS:
        raise ValueError(f"at least {MIN_TIMED_CALLS} timed calls are needed, got {iters}")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            if before_each is not None:
                before_each()
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    cuda = device.type == "cuda"
    if cuda:  # every event made (recorded once) before any timed call
        pool = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(len(names))]
        for start, end in pool:
            start.record()
            end.record()
    synchronize(device)

    for r in range(iters):
        order = names[r % len(names):] + names[: r % len(names)]
        events = []
        for i, name in enumerate(order):
            fn = fns[name]
            if warm_each:
                if before_each is not None:
                    before_each()
                fn()
            if before_each is not None:
                before_each()
            if cuda:
                torch.cuda.synchronize(device)
                start, end = pool[i]
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


def time_candidates(record: dict, fns: Mapping[str, Callable[[], object]], device: torch.device, args,
                    steps: int, before_each: Callable[[], None] | None = None) -> dict[str, Timing]:
    """``measure_interleaved`` with ``args.warmup`` / ``args.iters``; fills the record's
    ``other_load_cores``, ``timings``, ``ms`` (medians) and ``us_per_step`` (ms over ``steps``)."""
    other = OtherLoad()
    timings = measure_interleaved(fns, device, warmup=args.warmup, iters=args.iters, before_each=before_each,
                                  warm_each=not args.no_warm_each)
    record["warm_each"] = not args.no_warm_each
    record["other_load_cores"] = other.cores()
    record["timings"] = {k: t.summary() for k, t in timings.items()}
    record["ms"] = {k: t.median_ms for k, t in timings.items()}
    record["us_per_step"] = {k: v * 1e3 / steps for k, v in record["ms"].items()}
    return timings


# --------------------------------------------------------------------------------------
# Correctness before timing
# --------------------------------------------------------------------------------------
def rel_errors(got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """max|got - ref| / max|ref| per tensor (NaN propagates and fails the check)."""
    errs = {}
    for k, r in ref.items():
        if k not in got:
            raise AssertionError(f"missing result {k!r} (gradient not computed?)")
        if got[k].shape != r.shape:
            raise AssertionError(f"{k}: shape {tuple(got[k].shape)} != reference {tuple(r.shape)}")
        errs[k] = (got[k] - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
    return errs


def check(name: str, errs: Mapping[str, float], peer_errs: Mapping[str, float], floor: float,
          peer: str = "the peer") -> list[str]:
    """Failures of ``errs`` against err <= 2 * peer_err + floor, as readable lines."""
    bad = []
    for k, e in errs.items():
        bound = 2 * peer_errs[k] + floor
        if not e <= bound:  # NaN fails
            bad.append(f"{name} {k}: rel. error {e:.3g} > bound {bound:.3g} ({peer}'s {peer_errs[k]:.3g})")
    return bad


class ModuleCell:
    """The timed callables of a cell whose candidates are modules ``self.ours``, ``self.peer``
    and ``self.ref`` called as ``self.call(module, x, h0, c0)`` (first result: the output)
    on the cell's ``self.x``, ``self.h0``, ``self.c0``, in ``self.mode`` "infer" (forward
    under ``no_grad``) or "train" (forward + backward of the output's float sum)."""

    mode: str
    x: torch.Tensor
    h0: torch.Tensor
    c0: torch.Tensor

    def call(self, module, x, h0, c0):
        raise NotImplementedError

    def infer_fn(self, module):
        def run():
            with torch.no_grad():
                return self.call(module, self.x, self.h0, self.c0)

        return run

    def train_fn(self, module):
        def run():
            y = self.call(module, self.x, self.h0, self.c0)[0]
            y.float().sum().backward()
            return y

        return run

    def fn(self, module):
        return self.infer_fn(module) if self.mode == "infer" else self.train_fn(module)

    def clear_grads(self) -> None:
        for m in (self.ours, self.peer, self.ref):
            for p in m.parameters():
                p.grad = None
        self.x.grad = None


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


def capture_graphs(fns: Mapping[str, Callable[[], object]], record: dict) -> dict[str, CapturedGraph]:
    """Captures each inference callable into a CUDA graph; a capture that fails is recorded
    under ``record["graph_errors"]`` and reported (a finding, not a crash)."""
    graphs = {}
    for name, fn in fns.items():
        try:
            graphs[name] = capture_cuda_graph(fn)
        except Exception as exc:
            record.setdefault("graph_errors", {})[name] = f"{type(exc).__name__}: {exc}"
            progress(f"  ! CUDA graph capture failed for {name}: {exc}")
            torch.cuda.synchronize()
    return graphs


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


def cuda_kernel_times(fn: Callable[[], object], calls: int, warmup: int = 3,
                      name_chars: int = 90) -> dict[str, list[float]]:
    """The CUDA kernels (and memsets, copies) of ``calls`` calls of ``fn`` after ``warmup`` calls, by
    the profiler (torch.profiler): {name cut to ``name_chars``: the µs of each of its launches}.
    Diagnostic scripts' breakdowns; the profiler's own cost per runtime call stays out of kernel times."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            times.setdefault(e.name[:name_chars], []).append(us)
    return times


# CPU peak memory. There is no allocator counter to read on the CPU, so a child process per
# candidate measures its resident set: glibc's malloc is told (MALLOC_ENV) to map every block of
# 64 KiB or more on its own and unmap it when freed, so the resident set after a call is what is
# still live, and the peak of the next call above it is that call's own. Linux only.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _proc_status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def cpu_peak_rss_bytes(fn: Callable[[], object], before: Callable[[], None] | None = None) -> int | None:
    """Peak resident bytes of one call of ``fn`` above the resident size before it, after one
    untimed call (one-time allocations such as oneDNN's generated code are not the call's):
    VmHWM after resetting it through /proc/self/clear_refs. Meant for a child process started
    with MALLOC_ENV; ``None`` off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    fn()
    if before is not None:
        before()
    gc.collect()
    base = _proc_status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current resident size
    out = fn()
    peak = _proc_status_kb("VmHWM")
    del out
    return (peak - base) * 1024


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


# --------------------------------------------------------------------------------------
# The command line every suite shares, the loop over cells, the output
# --------------------------------------------------------------------------------------
PLOT_EXTRA = "matplotlib"


def add_common_args(p: argparse.ArgumentParser, json_default: str, *, tf32_and_graphs: bool = False) -> None:
    """The options of every bench script: device, warm-up and timed calls, threads, seed,
    output files; with ``tf32_and_graphs`` also --tf32 and --no-graphs (GPU suites)."""
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    if tf32_and_graphs:
        p.add_argument("--tf32", choices=["on", "off", "both"], default="on",
                       help="GPU float32 rows: on = PyTorch defaults (cuDNN TF32 on, matmul TF32 off); "
                            "off = both switches off for both sides; both = a row of each")
        p.add_argument("--no-graphs", action="store_true", help="GPU: skip the CUDA-graph columns")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls per candidate (default 3 CPU, 10 GPU)")
    p.add_argument("--iters", type=int, default=None,
                   help=f"timed calls per candidate, >= {MIN_TIMED_CALLS} (default 20 CPU, 50 GPU)")
    p.add_argument("--no-warm-each", action="store_true",
                   help="time each call right after the previous candidate's, without an untimed call of the "
                        "same candidate first (the method before 2026-11-21)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads; default torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help=f"records file (default bench_results/{json_default})")
    p.add_argument("--markdown", default=None, help="also write the table (with a heading) to this file")
    p.add_argument("--plot", default=None, metavar="PATH.png",
                   help="also plot the run: speed-up over the peer and µs per step against batch size, "
                        f"one line per size (needs {PLOT_EXTRA}: pip install {PLOT_EXTRA})")


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def parse_common(p: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``p.parse_args(argv)`` plus the checks of the common options, made before anything
    runs: --iters large enough, matplotlib importable when --plot is given."""
    args = p.parse_args(argv)
    if args.iters is not None and args.iters < MIN_TIMED_CALLS:
        p.error(f"--iters must be >= {MIN_TIMED_CALLS}")
    if args.plot is not None and not have_matplotlib():
        p.error(f"--plot needs matplotlib, which is not installed: pip install {PLOT_EXTRA} "
                "(or pip install 'seqkernels[plot]')")
    return args


def target_phrase(target: float, met: bool) -> str:
    """"≥2× yes" / "≥2× **no**": a speed-up target and whether the cell reached it."""
    return f"≥{target:g}× " + ("yes" if met else "**no**")


def target_text(r: dict) -> str:
    """The target column: "≥2× yes" / "≥2× **no**" (and ", memory yes/no" where measured),
    marked noisy when other processes kept more than 0.1 cores busy; the status if not ok."""
    if r["status"] != "ok":
        return r["status"].upper()
    text = "" if r.get("target_speedup") is None else target_phrase(r["target_speedup"], r["target_met"])
    if r.get("memory_met") is not None:
        text += ", memory " + ("yes" if r["memory_met"] else "**no**")
    other = r.get("other_load_cores")
    if other is not None and other > 0.1:
        text += f" (noisy: {other:.1f} other cores busy)"
    return text


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


def run_cells(script: str, cells: Sequence, run: Callable[[int, object], dict], label: Callable[[object], str],
              error_record: Callable[[object], dict], describe: Callable[[dict], str], document: dict,
              json_path: str, device: torch.device) -> int:
    """Runs ``run(i, cell)`` for every cell and appends its record to ``document["records"]``,
    rewriting ``json_path`` after each (a crash mid-run keeps the cells done). An exception is
    reported with its traceback and recorded as ``error_record(cell)`` with status "error".
    One progress line per cell on stderr: ``[i/n, ~time left] label: describe(record)``, or a
    loud block for a cell that is not ok. Sets ``document["elapsed_s"]``; returns the number
    of cells that failed."""
    failed = 0
    t_start = time.perf_counter()
    n = len(cells)
    for i, cell in enumerate(cells):
        try:
            record = run(i, cell)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            record = {**error_record(cell), "status": "error", "error": f"{type(exc).__name__}: {exc}"}
            if device.type == "cuda":
                torch.cuda.synchronize()
        document["records"].append(record)
        write_json(json_path, document)
        elapsed = time.perf_counter() - t_start
        remaining = elapsed / (i + 1) * (n - i - 1)
        left = f", ~{_duration(remaining)} left" if remaining >= 1 else ""
        head = f"[{i + 1}/{n}{left}] {label(cell)}:"
        if record["status"] != "ok":
            failed += 1
            progress(f"{'!' * 78}\n{head} {record['status'].upper()}: {record.get('error')}\n{'!' * 78}")
            continue
        progress(f"{head} {describe(record)}")
    document["elapsed_s"] = time.perf_counter() - t_start
    return failed


def finish(script: str, args, document: dict, json_path: str, table: str, heading: str, failed: int,
           notes: Sequence[str] = ()) -> int:
    """The end of a run: the JSON (with the elapsed time), the table on stdout (then
    ``notes``), a summary line, the markdown file (--markdown) and the plot (--plot).
    Returns the exit status: 1 if any cell failed."""
    write_json(json_path, document)
    print(table)
    for note in notes:
        print("\n" + note)
    n = len(document["records"])
    progress(f"{script}: {n - failed}/{n} cells ok in {document['elapsed_s']:.0f} s; records in {json_path}")
    if args.markdown:
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(heading + "\n\n" + table + "\n")
    if args.plot:
        if any(r.get("status") == "ok" for r in document["records"]):
            plot_document(document, args.plot)
            progress(f"{script}: plot in {args.plot}")
        else:
            progress(f"{script}: no cell ran to the end: no plot written")
    if failed:
        progress(f"{script}: {failed} cell(s) FAILED (see above and {json_path})")
        return 1
    return 0


# --------------------------------------------------------------------------------------
# Plots (matplotlib, optional: pip install matplotlib)
# --------------------------------------------------------------------------------------
# The size dimensions that make one line of a plot, per suite (x is always the batch B); a
# document names its own in "plot_series", this is the fallback for older files.
PLOT_SERIES = {"lstm-small-batch": ["H"], "convrnn": ["T", "C", "N", "K"], "convlstm": ["T", "Ci", "C", "H", "W", "K"]}
_MODE_STYLE = {"infer": "-", "train": "--"}
_DTYPE_MARKER = {"float32": "o", "bfloat16": "s", "float16": "^", "float64": "D"}


def _first_speedup(r: dict) -> float | None:
    """The speed-up over the eager peer: a number, or the first entry of the dict."""
    s = r.get("speedup")
    if isinstance(s, dict):
        return next(iter(s.values()), None)
    return s


def plot_records(records: Sequence[dict], path: str, *, series: Sequence[str], title: str,
                 ours: str = "seqkernels", peer: str = "the peer") -> None:
    """Writes a PNG of two panels against batch size B (log x): the speed-up over the peer,
    and seqkernels' µs per time step. One colour per value of ``series`` (the size fields
    that make a line, e.g. ["H"]), the line style per mode (infer solid, train dashed), the
    marker per dtype (hollow: TF32 off). Records whose status is not "ok" are left out."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    from matplotlib.ticker import FuncFormatter, NullLocator

    ok = [r for r in records if r.get("status") == "ok"]
    if not ok:
        raise ValueError("no record with status 'ok' to plot")

    def size_key(r):
        return tuple(r.get(k) for k in series)

    def style_key(r):
        return (r.get("mode", "?"), r.get("dtype", "?"), r.get("tf32") if r.get("tf32") in ("on", "off") else None)

    sizes = sorted({size_key(r) for r in ok}, key=lambda k: tuple((v is None, v) for v in k))
    styles = sorted({style_key(r) for r in ok}, key=lambda k: tuple(str(v) for v in k))
    fig = Figure(figsize=(13, 5.2), layout="constrained")
    ax_s, ax_t = fig.subplots(1, 2)
    colours = [f"C{i % 10}" for i in range(len(sizes))]
    batches = sorted({r["B"] for r in ok})
    for ci, size in enumerate(sizes):
        for mode, dtype, tf32 in styles:
            rows = sorted((r for r in ok if size_key(r) == size and style_key(r) == (mode, dtype, tf32)),
                          key=lambda r: r["B"])
            if not rows:
                continue
            name = ", ".join(f"{k}={v}" for k, v in zip(series, size))
            label = f"{name} {mode} {dtype}" + (f" TF32 {tf32}" if tf32 else "")
            style = dict(color=colours[ci], linestyle=_MODE_STYLE.get(mode, ":"),
                         marker=_DTYPE_MARKER.get(dtype, "x"), fillstyle="none" if tf32 == "off" else "full")
            xs = [r["B"] for r in rows]
            ax_s.plot(xs, [_first_speedup(r) or float("nan") for r in rows], label=label, **style)
            ax_t.plot(xs, [r["us_per_step"].get(ours, float("nan")) for r in rows], label=label, **style)
    ax_s.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax_s.set_ylabel(f"speed-up over {peer} (×, higher is better)")
    ax_t.set_ylabel(f"{ours} µs per step (lower is better)")
    speedups = [s for s in map(_first_speedup, ok) if s]
    log_axes = [ax_t] + ([ax_s] if speedups and max(speedups) > 20 * min(speedups) else [])
    for ax in log_axes:  # plain numbers on log axes: 1, 2, 5, 10, 20, 50, ...
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5) else ""))
    for ax in (ax_s, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.xaxis.set_minor_locator(NullLocator())  # only the measured batch sizes are ticked
        ax.set_xlabel("batch size B")
        ax.grid(True, which="major", alpha=0.3)
    ax_s.legend(fontsize="small")
    fig.suptitle(title)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, dpi=110)


def plot_document(document: dict, path: str) -> None:
    """``plot_records`` for a document as the bench scripts write it (their --json)."""
    env = document.get("environment", {})
    suite = document.get("suite", "benchmark")
    series = document.get("plot_series") or PLOT_SERIES.get(suite) or ["H"]
    title = (f"{suite}: {env.get('device_name', '?')} ({env.get('device', '?')}), torch {env.get('torch', '?')}, "
             f"{env.get('date', '')}")
    plot_records(document["records"], path, series=series, title=title,
                 ours=document.get("ours", "seqkernels"), peer=document.get("peer", "the peer"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Benchmark harness tools.")
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("plot", help="plot a JSON written by a bench script (--json) to a PNG")
    pp.add_argument("json", help="the records file (bench_results/<suite>_<device>.json)")
    pp.add_argument("png", help="the image to write")
    args = p.parse_args(argv)
    if not have_matplotlib():
        p.error(f"plot needs matplotlib, which is not installed: pip install {PLOT_EXTRA}")
    with open(args.json, encoding="utf-8") as f:
        document = json.load(f)
    try:
        plot_document(document, args.png)
    except ValueError as exc:
        raise SystemExit(f"harness plot: {args.json}: {exc}") from exc
    progress(f"harness plot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
