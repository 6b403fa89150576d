"""The LSTM small-batch suite (/work/shared/performance.md): seqkernels.LSTM against
torch.nn.LSTM with the same weights, in the same process, measurements interleaved.

One layer, unidirectional, I = H, T = 256, batch-second input [T, B, H], random inputs and
random initial states (never zeros).

  CPU  (default without a GPU): B in {1, 8, 64} x H in {256, 512}, float32.
  GPU: B in {1, 8, 16, 64, 256} x H in {256, 512, 1024} x {float32, bfloat16}.

Modes:
  infer  forward under torch.no_grad(), the whole sequence, input projection included
  train  forward + backward of output.float().sum(), all gradients (weights, biases and
         the input), gradients cleared (set to None) before every call, untimed

Peers: torch.nn.LSTM eager (cuDNN on GPU); on GPU also nn.LSTM captured in a CUDA graph
(infer), and seqkernels in a CUDA graph (infer) as an extra column. float32 on GPU runs
with PyTorch's defaults (cuDNN TF32 on, cuBLAS matmul TF32 off) unless --tf32 off|both;
the TF32 switches are recorded per row. Before timing, every cell checks that seqkernels
agrees with a float64 nn.LSTM reference as well as nn.LSTM itself does (within 2x its
error plus a dtype floor); a cell that fails is not timed, is reported loudly, and the
script exits non-zero.

Examples:
  python benchmarks/bench_lstm.py                       # the full suite on the default device
  python benchmarks/bench_lstm.py --quick               # a smoke run (a few cells)
  python benchmarks/bench_lstm.py --batch 1 8 --hidden 256 --mode infer --markdown table.md
  python benchmarks/bench_lstm.py --device cuda --tf32 both --json bench_results/h100.json

The table goes to stdout, one progress line per cell to stderr, the records to --json
(default bench_results/lstm_<device>.json). SEQKERNELS_LSTM_BACKEND, if set, is recorded.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import itertools
import os
import subprocess
import sys
import time
import traceback

import warnings

import torch

# nn.LSTM warns once per process that bf16 weights are not one contiguous chunk (see
# peer_note in run_cell); the fact is recorded per cell instead.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

try:
    import seqkernels  # noqa: E402
except ImportError as exc:  # the package raises with the reason when _C is missing
    raise SystemExit(
        f"bench_lstm: cannot import seqkernels ({exc}).\n"
        "Build it first: pip install --no-build-isolation --no-deps -e .  (or bash scripts/bench.sh)"
    ) from exc

SUITE = "lstm-small-batch"
OURS = "seqkernels"
PEER = "nn.LSTM"
OURS_GRAPH = "seqkernels graph"
PEER_GRAPH = "nn.LSTM graph"

GRID = {
    "cpu": {"batch": [1, 8, 64], "hidden": [256, 512], "dtype": ["float32"]},
    "cuda": {"batch": [1, 8, 16, 64, 256], "hidden": [256, 512, 1024], "dtype": ["float32", "bfloat16"]},
}
QUICK = {
    "cpu": {"batch": [1, 8], "hidden": [256], "dtype": ["float32"]},
    "cuda": {"batch": [1, 64], "hidden": [256], "dtype": ["float32", "bfloat16"]},
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}

# Error floors for the correctness check, relative to max|reference| of each tensor.
# The check: err(seqkernels) <= 2 * err(nn.LSTM) + floor, both against float64.
FLOOR = {"float64": 1e-9, "float32": 1e-4, "tf32": 5e-3, "float16": 5e-3, "bfloat16": 3e-2}


# --------------------------------------------------------------------------------------
# Targets (performance.md): the speed-up over the eager peer each cell must reach.
# --------------------------------------------------------------------------------------
def target(device: str, batch: int, mode: str, dtype: str, tf32_off: bool) -> float | None:
    if device == "cpu":
        if batch <= 8:
            return 2.0 if mode == "infer" else 1.5
        if batch == 64:
            return 1.0
        return None
    if batch <= 16:
        if dtype == "float32" and tf32_off:
            return 3.0 if mode == "infer" else 2.0
        return 5.0 if mode == "infer" else 3.0
    if batch == 64:
        return 2.0
    if batch == 256:
        return 1.0
    return None


def graph_target(device: str, batch: int, mode: str) -> float | None:
    return 3.0 if device == "cuda" and mode == "infer" and batch <= 16 else None


# --------------------------------------------------------------------------------------
# One cell
# --------------------------------------------------------------------------------------
class Cell:
    """The models and tensors of one (B, H, dtype, mode, TF32) cell."""

    def __init__(self, device: torch.device, T: int, B: int, H: int, dtype: torch.dtype, mode: str, seed: int):
        self.device, self.T, self.B, self.H, self.dtype, self.mode = device, T, B, H, dtype, mode
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        # nn.LSTM's own initialisation: U(-1/sqrt(H), 1/sqrt(H)) on every weight and bias.
        peer = torch.nn.LSTM(H, H, num_layers=1, bias=True, batch_first=False, bidirectional=False)
        ours = seqkernels.LSTM(H, H, num_layers=1, bias=True, batch_first=False, bidirectional=False)
        ours.load_state_dict(peer.state_dict())
        self.peer = peer.to(device=device, dtype=dtype)
        self.ours = ours.to(device=device, dtype=dtype)
        # The float64 reference holds the very same (possibly bf16-rounded) weights.
        self.ref = copy.deepcopy(self.peer).to(torch.float64)

        x = torch.randn(T, B, H, generator=gen)
        h0 = 0.5 * torch.randn(1, B, H, generator=gen)
        c0 = 0.5 * torch.randn(1, B, H, generator=gen)
        self.x = x.to(device=device, dtype=dtype)
        self.h0 = h0.to(device=device, dtype=dtype)
        self.c0 = c0.to(device=device, dtype=dtype)
        if mode == "train":
            self.x.requires_grad_(True)

    # -- the callables that are timed ---------------------------------------------------
    def infer_fn(self, module):
        def run():
            with torch.no_grad():
                return module(self.x, (self.h0, self.c0))

        return run

    def train_fn(self, module):
        def run():
            y, _ = module(self.x, (self.h0, self.c0))
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

    # -- correctness ---------------------------------------------------------------------
    def _results(self, module, x, h0, c0) -> dict[str, torch.Tensor]:
        """Outputs (and, in train mode, gradients) of one call, as float64 tensors."""
        self.clear_grads()
        if self.mode == "infer":
            with torch.no_grad():
                y, (hn, cn) = module(x, (h0, c0))
            return {"y": y.double(), "h_n": hn.double(), "c_n": cn.double()}
        x = x.detach().requires_grad_(True)
        y, (hn, cn) = module(x, (h0, c0))
        (y.sum() if y.dtype == torch.float64 else y.float().sum()).backward()
        out = {"y": y.detach().double(), "h_n": hn.detach().double(), "c_n": cn.detach().double(),
               "grad_x": x.grad.double()}
        for name, p in module.named_parameters():
            out["grad_" + name] = p.grad.double()
        return out

    def reference(self) -> dict[str, torch.Tensor]:
        d = torch.float64
        return self._results(self.ref, self.x.detach().to(d), self.h0.to(d), self.c0.to(d))

    def results(self, module) -> dict[str, torch.Tensor]:
        return self._results(module, self.x.detach(), self.h0, self.c0)


def rel_errors(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """max|got - ref| / max|ref| per tensor (NaN propagates and fails the check)."""
    errs = {}
    for k, r in ref.items():
        if k not in got:
            raise AssertionError(f"missing result {k!r} (gradient not computed?)")
        g = got[k]
        if g.shape != r.shape:
            raise AssertionError(f"{k}: shape {tuple(g.shape)} != reference {tuple(r.shape)}")
        scale = r.abs().max().item()
        errs[k] = (g - r).abs().max().item() / max(scale, 1e-30)
    return errs


def check(name: str, errs: dict[str, float], peer_errs: dict[str, float], floor: float) -> list[str]:
    """Failures of ``errs`` against err <= 2 * peer_err + floor, as readable lines."""
    bad = []
    for k, e in errs.items():
        bound = 2 * peer_errs[k] + floor
        if not e <= bound:  # NaN fails
            bad.append(f"{name} {k}: rel. error {e:.3g} > bound {bound:.3g} (nn.LSTM's {peer_errs[k]:.3g})")
    return bad


# --------------------------------------------------------------------------------------
# Running the suite
# --------------------------------------------------------------------------------------
def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        return (out.stdout.strip() or None) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def extension_build() -> dict:
    """Which build of seqkernels._C is measured: file, size, modification time, sha256."""
    path = getattr(seqkernels._C, "__file__", None)
    if not path or not os.path.exists(path):
        return {"file": path}
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    mtime = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    return {"file": os.path.basename(path), "bytes": os.path.getsize(path),
            "mtime_utc": mtime.isoformat(timespec="seconds"), "sha256_16": digest}


def run_cell(args, device: torch.device, env: dict, B: int, H: int, dtype_name: str, mode: str,
             tf32: str, seed: int) -> dict:
    dtype = DTYPES[dtype_name]
    cuda = device.type == "cuda"
    if cuda and dtype == torch.float32:
        harness.set_tf32(False if tf32 == "off" else None)
    elif cuda:
        harness.set_tf32(None)
    tf32_active = cuda and dtype == torch.float32 and tf32 != "off"
    record = {
        "suite": SUITE,
        **env,
        "seqkernels": seqkernels.__version__,
        "commit": args.commit,
        "backend_env": os.environ.get("SEQKERNELS_LSTM_BACKEND"),
        "T": args.seq_len, "B": B, "I": H, "H": H, "layers": 1, "bidirectional": False, "batch_first": False,
        "dtype": dtype_name,
        "mode": mode,
        "tf32": (tf32 if dtype == torch.float32 else "n/a") if cuda else "n/a",
        "tf32_flags": harness.tf32_state() if cuda else None,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if cuda else None,
        "warmup": args.warmup, "iters": args.iters,
        "load_avg_before": harness.load_average(),
        "status": "ok",
        "target_speedup": target(device.type, B, mode, dtype_name, cuda and dtype == torch.float32 and tf32 == "off"),
        "target_speedup_vs_graph": graph_target(device.type, B, mode),
    }
    cell = Cell(device, args.seq_len, B, H, dtype, mode, seed)
    if cuda and not torch.backends.cudnn.is_acceptable(cell.peer.weight_ih_l0):
        # torch.nn.LSTM.flatten_parameters skips dtypes outside cudnn.CUDNN_TENSOR_DTYPES
        # (bfloat16 among them), so cuDNN compacts the weights on every call: that is what
        # any user's nn.LSTM of this dtype does, and it is what is measured.
        record["peer_note"] = f"nn.LSTM weights not flattened for {dtype_name}: cuDNN compacts them every call"

    # Correctness, once, before any timing.
    floor = FLOOR["tf32" if tf32_active else dtype_name]
    ref = cell.reference()
    peer_errs = rel_errors(cell.results(cell.peer), ref)
    ours_errs = rel_errors(cell.results(cell.ours), ref)
    failures = check(OURS, ours_errs, peer_errs, floor)
    record["rel_error"] = {OURS: ours_errs, PEER: peer_errs, "floor": floor}

    fns = {OURS: cell.fn(cell.ours), PEER: cell.fn(cell.peer)}
    graphs = {}
    if cuda and mode == "infer" and not args.no_graphs:
        for name, module in ((PEER_GRAPH, cell.peer), (OURS_GRAPH, cell.ours)):
            try:
                graphs[name] = harness.capture_cuda_graph(cell.infer_fn(module))
            except Exception as exc:  # a capture failure is a finding, not a crash
                record.setdefault("graph_errors", {})[name] = f"{type(exc).__name__}: {exc}"
                harness.progress(f"  ! CUDA graph capture failed for {name}: {exc}")
                torch.cuda.synchronize()
        if OURS_GRAPH in graphs:
            y, (hn, cn) = graphs[OURS_GRAPH].replay()
            torch.cuda.synchronize()
            got = {"y": y.double(), "h_n": hn.double(), "c_n": cn.double()}
            graph_errs = rel_errors(got, ref)
            record["rel_error"][OURS_GRAPH] = graph_errs
            failures += check(OURS_GRAPH, graph_errs, peer_errs, floor)
        fns.update(graphs)
    del ref

    if failures:
        record["status"] = "wrong"
        record["error"] = "; ".join(failures)
        return record

    before = cell.clear_grads if mode == "train" else None
    other = harness.OtherLoad()
    timings = harness.measure_interleaved(fns, device, warmup=args.warmup, iters=args.iters, before_each=before)
    record["other_load_cores"] = other.cores()
    record["timings"] = {k: t.summary() for k, t in timings.items()}
    record["ms"] = {k: t.median_ms for k, t in timings.items()}
    record["us_per_step"] = {k: t.median_ms * 1e3 / args.seq_len for k, t in timings.items()}
    ms = record["ms"]
    record["speedup"] = {
        f"{OURS} vs {PEER}": harness.speedup(ms.get(PEER), ms.get(OURS)),
    }
    if PEER_GRAPH in ms:
        record["speedup"][f"{OURS} vs {PEER_GRAPH}"] = harness.speedup(ms[PEER_GRAPH], ms[OURS])
        if OURS_GRAPH in ms:
            record["speedup"][f"{OURS_GRAPH} vs {PEER_GRAPH}"] = harness.speedup(ms[PEER_GRAPH], ms[OURS_GRAPH])
    if OURS_GRAPH in ms:
        record["speedup"][f"{OURS_GRAPH} vs {PEER}"] = harness.speedup(ms[PEER], ms[OURS_GRAPH])
    if cuda and mode == "train":
        record["peak_mb"] = {
            name: harness.peak_memory_bytes(fns[name], device, before=cell.clear_grads) / 2**20
            for name in (OURS, PEER)
        }
    record["load_avg_after"] = harness.load_average()
    tgt = record["target_speedup"]
    s = record["speedup"][f"{OURS} vs {PEER}"]
    record["target_met"] = None if tgt is None or s is None else s >= tgt
    return record


def columns(device: str) -> list[harness.Column]:
    sp = lambda key: (lambda r: r["speedup"].get(key))  # noqa: E731
    ms = lambda key: (lambda r: r["ms"].get(key))  # noqa: E731
    status = lambda r: r["status"].upper() if r["status"] != "ok" else None  # noqa: E731

    def met(r):
        if r["status"] != "ok":
            return r["status"].upper()
        text = "" if r.get("target_speedup") is None else (
            f"≥{r['target_speedup']:g}× " + ("yes" if r["target_met"] else "**no**"))
        other = r.get("other_load_cores")
        if other is not None and other > 0.1:
            text += f" (noisy: {other:.1f} other cores busy)"
        return text

    cols = [
        harness.Column("B", lambda r: r["B"], "{}"),
        harness.Column("H", lambda r: r["H"], "{}"),
        harness.Column("dtype", lambda r: r["dtype"], align="left"),
    ]
    if device == "cuda":
        cols.append(harness.Column("TF32", lambda r: r["tf32"], align="left"))
    cols += [
        harness.Column("mode", lambda r: r["mode"], align="left"),
        harness.Column("seqkernels ms", lambda r: status(r) or r["ms"][OURS], "{:.3f}"),
        harness.Column("µs/step", lambda r: r["us_per_step"][OURS], "{:.2f}"),
        harness.Column("cuDNN ms" if device == "cuda" else "nn.LSTM ms", ms(PEER), "{:.3f}"),
        harness.Column("speed-up", sp(f"{OURS} vs {PEER}"), "{:.2f}×"),
    ]
    if device == "cuda":
        cols += [
            harness.Column("cuDNN graph ms", ms(PEER_GRAPH), "{:.3f}"),
            harness.Column("vs graph", sp(f"{OURS} vs {PEER_GRAPH}"), "{:.2f}×"),
            harness.Column("seqkernels graph ms", ms(OURS_GRAPH), "{:.3f}"),
            harness.Column("graph µs/step", lambda r: r["us_per_step"][OURS_GRAPH], "{:.2f}"),
            harness.Column("graph vs graph", sp(f"{OURS_GRAPH} vs {PEER_GRAPH}"), "{:.2f}×"),
            harness.Column("peak MB (ours / cuDNN)",
                           lambda r: f"{r['peak_mb'][OURS]:.1f} / {r['peak_mb'][PEER]:.1f}"),
        ]
    cols.append(harness.Column("target (vs eager)", met, align="left"))
    return cols


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--quick", action="store_true", help="a small subset of the grid, for smoke runs and CI")
    p.add_argument("--batch", type=int, nargs="+", help="batch sizes (replace the grid's)")
    p.add_argument("--hidden", type=int, nargs="+", help="hidden sizes (I = H) (replace the grid's)")
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), help="dtypes (replace the grid's)")
    p.add_argument("--mode", nargs="+", choices=["infer", "train"], default=["infer", "train"])
    p.add_argument("--tf32", choices=["on", "off", "both"], default="on",
                   help="GPU float32 rows: on = PyTorch defaults (cuDNN TF32 on, matmul TF32 off); "
                        "off = both switches off for both sides; both = a row of each")
    p.add_argument("--seq-len", type=int, default=256, help="T (default 256, the suite's)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls per candidate (default 3 CPU, 10 GPU)")
    p.add_argument("--iters", type=int, default=None,
                   help=f"timed calls per candidate, >= {harness.MIN_TIMED_CALLS} (default 20 CPU, 50 GPU)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads; default torch's)")
    p.add_argument("--no-graphs", action="store_true", help="GPU: skip the CUDA-graph columns")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="records file (default bench_results/lstm_<device>.json)")
    p.add_argument("--markdown", default=None, help="also write the table (with a heading) to this file")
    args = p.parse_args(argv)
    if args.iters is not None and args.iters < harness.MIN_TIMED_CALLS:
        p.error(f"--iters must be >= {harness.MIN_TIMED_CALLS}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = harness.setup_device(args, "bench_lstm")
    cuda = device.type == "cuda"
    args.commit = git_commit()

    grid = dict((QUICK if args.quick else GRID)[device.type])
    if args.batch:
        grid["batch"] = args.batch
    if args.hidden:
        grid["hidden"] = args.hidden
    if args.dtype:
        grid["dtype"] = args.dtype
    tf32_modes = {"on": ["on"], "off": ["off"], "both": ["on", "off"]}[args.tf32]

    cells = []
    for dtype_name, H, B, mode in itertools.product(grid["dtype"], grid["hidden"], grid["batch"], args.mode):
        for tf32 in (tf32_modes if cuda and dtype_name == "float32" else ["n/a"]):
            cells.append((B, H, dtype_name, mode, tf32))

    env = harness.environment(device)
    env["extension"] = extension_build()
    json_path = args.json or os.path.join("bench_results", f"lstm_{device.type}.json")
    document = {"suite": SUITE, "environment": env, "argv": sys.argv[1:], "records": []}
    harness.progress(
        f"bench_lstm: {len(cells)} cells on {env['device_name']} ({device}), torch {env['torch']}, "
        f"{env['threads']} threads, T={args.seq_len}, warm-up {args.warmup}, {args.iters} timed calls each"
        + (f", SEQKERNELS_LSTM_BACKEND={os.environ['SEQKERNELS_LSTM_BACKEND']}"
           if os.environ.get("SEQKERNELS_LSTM_BACKEND") else "")
    )

    probe = harness.OtherLoad()
    time.sleep(1.0)
    busy = probe.cores()
    if busy is not None and busy > 0.1:
        harness.progress(f"bench_lstm: warning: other processes keep {busy:.2f} cores busy: timings will be noisy "
                         "(each cell records other_load_cores; cells above 0.1 are marked NOISY)")

    failed = 0
    t_start = time.perf_counter()
    for i, (B, H, dtype_name, mode, tf32) in enumerate(cells):
        label = f"B={B} H={H} {dtype_name} {mode}" + (f" tf32={tf32}" if tf32 != "n/a" else "")
        try:
            record = run_cell(args, device, env, B, H, dtype_name, mode, tf32, seed=args.seed + i)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            record = {"suite": SUITE, **env, "T": args.seq_len, "B": B, "I": H, "H": H, "dtype": dtype_name,
                      "mode": mode, "tf32": tf32, "status": "error", "error": f"{type(exc).__name__}: {exc}"}
            if cuda:
                torch.cuda.synchronize()
        document["records"].append(record)
        harness.write_json(json_path, document)

        head = f"[{i + 1}/{len(cells)}] {label}:"
        if record["status"] != "ok":
            failed += 1
            bar = "!" * 78
            harness.progress(f"{bar}\n{head} {record['status'].upper()}: {record.get('error')}\n{bar}")
            continue
        ms = record["ms"]
        parts = [f"{OURS} {ms[OURS]:.3f} ms ({record['us_per_step'][OURS]:.2f} us/step)"]
        for name in (PEER, PEER_GRAPH, OURS_GRAPH):
            if name in ms:
                parts.append(f"{name} {ms[name]:.3f} ms")
        parts.append("speed-up " + ", ".join(f"{k.split(' vs ')[1] if k.startswith(OURS + ' vs') else k} {v:.2f}x"
                                              for k, v in record["speedup"].items() if v is not None))
        other = record.get("other_load_cores")
        if other is not None and other > 0.1:
            parts.append(f"NOISY: other processes kept {other:.2f} cores busy")
        harness.progress(f"{head} " + " | ".join(parts))

    table = harness.markdown_table(document["records"], columns(device.type))
    elapsed = time.perf_counter() - t_start
    document["elapsed_s"] = elapsed
    harness.write_json(json_path, document)
    print(table)
    harness.progress(f"bench_lstm: {len(cells) - failed}/{len(cells)} cells ok in {elapsed:.0f} s; records in {json_path}")
    if args.markdown:
        heading = (
            f"LSTM small-batch suite on {env['device_name']} ({device.type}, {env['threads']} threads), "
            f"torch {env['torch']}, {env['date']}; T={args.seq_len}, I=H, 1 layer, batch-second; "
            f"median of {args.iters} interleaved calls after {args.warmup} warm-up."
        )
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(heading + "\n\n" + table + "\n")
    if failed:
        harness.progress(f"bench_lstm: {failed} cell(s) FAILED (see above and {json_path})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
