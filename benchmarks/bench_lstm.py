"""The LSTM small-batch suite (/work/shared/performance.md): seqkernels.LSTM against
torch.nn.LSTM with the same weights, in the same process, measurements interleaved.

One layer, unidirectional, I = H, T = 256, batch-second input [T, B, H], random inputs and
random initial states (never zeros).

  CPU  (default without a GPU): B in {1, 8, 64} x H in {256, 512}, float32.
  GPU: B in {1, 8, 16, 64, 256} x H in {256, 512, 1024} x {float32, bfloat16}.

--packed: every cell's input is a PackedSequence instead (both modules get the same one):
sequence b of B has length round(T - b (T / 2) / (B - 1)), T down to T / 2, so the batch
shrinks from B to 1 row over the second half (up to B distinct batch sizes).

--proj-size P: both modules with a projection (proj_size = P < H; h0 and the output of width P).
The suite's targets are for cells without one, so these cells have none.

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
  python benchmarks/bench_lstm.py --quick --plot lstm.png   # also a PNG (needs matplotlib)
  python benchmarks/bench_lstm.py --packed --batch 8 16 --hidden 256 512 --dtype float16
  python benchmarks/bench_lstm.py --proj-size 256 --batch 8 64 --hidden 512 --dtype float16

The table goes to stdout, one progress line per cell to stderr, the records to --json
(default bench_results/lstm_<device>.json), with --plot PATH.png a figure of the speed-up
and µs per step against B, one line per H. SEQKERNELS_LSTM_BACKEND, if set, is recorded.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import os
import sys
import time
import warnings

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

# nn.LSTM warns once per process that bf16 weights are not one contiguous chunk (see
# peer_note in run_cell); the fact is recorded per cell instead.
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

seqkernels = harness.import_seqkernels("bench_lstm")

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
DTYPES = harness.DTYPES
# The correctness check: err(seqkernels) <= 2 * err(nn.LSTM) + FLOOR[dtype], both against float64.
FLOOR = harness.FLOOR


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
def packed_lengths(T: int, B: int) -> torch.Tensor:
    """--packed: the sequence lengths, T down to T / 2 (longest first)."""
    if B == 1:
        return torch.tensor([T])
    return torch.linspace(T, T / 2, B).round().long()


class Cell(harness.ModuleCell):
    """The models and tensors of one (B, H, dtype, mode, TF32) cell. Packed: self.x is the packed
    data (a leaf, so that training calls get its gradient) and call() wraps it with the batch sizes."""

    def __init__(self, device: torch.device, T: int, B: int, H: int, dtype: torch.dtype, mode: str, seed: int,
                 packed: bool = False, proj_size: int = 0):
        self.device, self.T, self.B, self.H, self.dtype, self.mode = device, T, B, H, dtype, mode
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        # nn.LSTM's own initialisation: U(-1/sqrt(H), 1/sqrt(H)) on every weight and bias.
        peer = torch.nn.LSTM(H, H, num_layers=1, bias=True, batch_first=False, bidirectional=False,
                             proj_size=proj_size)
        ours = seqkernels.LSTM(H, H, num_layers=1, bias=True, batch_first=False, bidirectional=False,
                               proj_size=proj_size)
        ours.load_state_dict(peer.state_dict())
        self.peer = peer.to(device=device, dtype=dtype)
        self.ours = ours.to(device=device, dtype=dtype)
        # The float64 reference holds the very same (possibly bf16-rounded) weights.
        self.ref = copy.deepcopy(self.peer).to(torch.float64)

        x = torch.randn(T, B, H, generator=gen)
        self.batch_sizes = None
        if packed:
            packed_x = pack_padded_sequence(x, packed_lengths(T, B))
            x, self.batch_sizes = packed_x.data, packed_x.batch_sizes
        h0 = 0.5 * torch.randn(1, B, proj_size or H, generator=gen)
        c0 = 0.5 * torch.randn(1, B, H, generator=gen)
        self.x = x.to(device=device, dtype=dtype)
        self.h0 = h0.to(device=device, dtype=dtype)
        self.c0 = c0.to(device=device, dtype=dtype)
        if mode == "train":
            self.x.requires_grad_(True)

    def call(self, module, x, h0, c0):
        """module(x, (h0, c0)): (y, (h_n, c_n)); packed, y is the output's packed data."""
        if self.batch_sizes is None:
            return module(x, (h0, c0))
        y, state = module(PackedSequence(x, self.batch_sizes), (h0, c0))
        return y.data, state

    # -- correctness ---------------------------------------------------------------------
    def _results(self, module, x, h0, c0) -> dict[str, torch.Tensor]:
        """Outputs (and, in train mode, gradients) of one call, as float64 tensors."""
        self.clear_grads()
        if self.mode == "infer":
            with torch.no_grad():
                y, (hn, cn) = self.call(module, x, h0, c0)
            return {"y": y.double(), "h_n": hn.double(), "c_n": cn.double()}
        x = x.detach().requires_grad_(True)
        y, (hn, cn) = self.call(module, x, h0, c0)
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


# --------------------------------------------------------------------------------------
# Running the suite
# --------------------------------------------------------------------------------------
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
        "packed": bool(args.packed),
        "proj_size": args.proj_size,
        "dtype": dtype_name,
        "mode": mode,
        "tf32": (tf32 if dtype == torch.float32 else "n/a") if cuda else "n/a",
        "tf32_flags": harness.tf32_state() if cuda else None,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if cuda else None,
        "warmup": args.warmup, "iters": args.iters,
        "load_avg_before": harness.load_average(),
        "status": "ok",
        # The targets are the padded suite's (performance.md); --packed and --proj-size cells have none.
        "target_speedup": None if args.packed or args.proj_size else target(
            device.type, B, mode, dtype_name, cuda and dtype == torch.float32 and tf32 == "off"),
        "target_speedup_vs_graph": None if args.packed or args.proj_size else graph_target(device.type, B, mode),
    }
    cell = Cell(device, args.seq_len, B, H, dtype, mode, seed, packed=args.packed, proj_size=args.proj_size)
    if cuda and not torch.backends.cudnn.is_acceptable(cell.peer.weight_ih_l0):
        # torch.nn.LSTM.flatten_parameters skips dtypes outside cudnn.CUDNN_TENSOR_DTYPES
        # (bfloat16 among them), so cuDNN compacts the weights on every call: that is what
        # any user's nn.LSTM of this dtype does, and it is what is measured.
        record["peer_note"] = f"nn.LSTM weights not flattened for {dtype_name}: cuDNN compacts them every call"

    # Correctness, once, before any timing.
    floor = FLOOR["tf32" if tf32_active else dtype_name]
    ref = cell.reference()
    peer_errs = harness.rel_errors(cell.results(cell.peer), ref)
    ours_errs = harness.rel_errors(cell.results(cell.ours), ref)
    failures = harness.check(OURS, ours_errs, peer_errs, floor, PEER)
    record["rel_error"] = {OURS: ours_errs, PEER: peer_errs, "floor": floor}

    fns = {OURS: cell.fn(cell.ours), PEER: cell.fn(cell.peer)}
    if cuda and mode == "infer" and not args.no_graphs:
        graphs = harness.capture_graphs({PEER_GRAPH: cell.infer_fn(cell.peer), OURS_GRAPH: cell.infer_fn(cell.ours)},
                                        record)
        if OURS_GRAPH in graphs:
            y, (hn, cn) = graphs[OURS_GRAPH].replay()
            torch.cuda.synchronize()
            got = {"y": y.double(), "h_n": hn.double(), "c_n": cn.double()}
            graph_errs = harness.rel_errors(got, ref)
            record["rel_error"][OURS_GRAPH] = graph_errs
            failures += harness.check(OURS_GRAPH, graph_errs, peer_errs, floor, PEER)
        fns.update(graphs)
    del ref

    if failures:
        record["status"] = "wrong"
        record["error"] = "; ".join(failures)
        return record

    before = cell.clear_grads if mode == "train" else None
    harness.time_candidates(record, fns, device, args, args.seq_len, before_each=before)
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
        def fresh_call() -> None:
            # The kept buffers of the replayed cuBLAS loop (seqkernels.release_step_graphs) are
            # dropped first, so that the peak counts them.
            cell.clear_grads()
            seqkernels.release_step_graphs()

        record["peak_mb"] = {
            name: harness.peak_memory_bytes(fns[name], device, before=fresh_call) / 2**20
            for name in (OURS, PEER)
        }
    record["load_avg_after"] = harness.load_average()
    tgt = record["target_speedup"]
    s = record["speedup"][f"{OURS} vs {PEER}"]
    record["target_met"] = None if tgt is None or s is None else s >= tgt
    graph_tgt = record["target_speedup_vs_graph"]
    gs = record["speedup"].get(f"{OURS_GRAPH} vs {PEER_GRAPH}")
    record["target_met_vs_graph"] = None if graph_tgt is None or gs is None else gs >= graph_tgt
    return record


def graph_target_text(r: dict) -> str:
    """The CUDA table's graph-target column: our CUDA graph against cuDNN's, "≥3× yes" / "≥3× **no**"
    (issue 4: `infer` at B <= 16), empty where there is no such target or no graph was timed."""
    if r["status"] != "ok" or r.get("target_met_vs_graph") is None:
        return ""
    return harness.target_phrase(r["target_speedup_vs_graph"], r["target_met_vs_graph"])


def columns(device: str) -> list[harness.Column]:
    sp = lambda key: (lambda r: r["speedup"].get(key))  # noqa: E731
    ms = lambda key: (lambda r: r["ms"].get(key))  # noqa: E731
    status = lambda r: r["status"].upper() if r["status"] != "ok" else None  # noqa: E731

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
    cols.append(harness.Column("target (vs eager)", harness.target_text, align="left"))
    if device == "cuda":
        cols.append(harness.Column("target (graph vs graph)", graph_target_text, align="left"))
    return cols


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true", help="a small subset of the grid, for smoke runs and CI")
    p.add_argument("--batch", type=int, nargs="+", help="batch sizes (replace the grid's)")
    p.add_argument("--hidden", type=int, nargs="+", help="hidden sizes (I = H) (replace the grid's)")
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), help="dtypes (replace the grid's)")
    p.add_argument("--mode", nargs="+", choices=["infer", "train"], default=["infer", "train"])
    p.add_argument("--seq-len", type=int, default=256, help="T (default 256, the suite's)")
    p.add_argument("--packed", action="store_true",
                   help="PackedSequence input: lengths T down to T / 2 (see above)")
    p.add_argument("--proj-size", type=int, default=0, metavar="P",
                   help="both modules with proj_size = P (0 < P < every H; default 0, none)")
    harness.add_common_args(p, "lstm_<device>.json", tf32_and_graphs=True)
    args = harness.parse_common(p, argv)
    if args.proj_size < 0:
        p.error(f"--proj-size must be >= 0, got {args.proj_size}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = harness.setup_device(args, "bench_lstm")
    cuda = device.type == "cuda"
    args.commit = harness.git_commit()

    grid = dict((QUICK if args.quick else GRID)[device.type])
    if args.batch:
        grid["batch"] = args.batch
    if args.hidden:
        grid["hidden"] = args.hidden
    if args.dtype:
        grid["dtype"] = args.dtype
    if args.proj_size and any(args.proj_size >= H for H in grid["hidden"]):
        print(f"bench_lstm: --proj-size {args.proj_size} must be below every hidden size {grid['hidden']}",
              file=sys.stderr)
        return 2

    cells = []
    for dtype_name, H, B, mode in itertools.product(grid["dtype"], grid["hidden"], grid["batch"], args.mode):
        for tf32 in (harness.TF32_ROWS[args.tf32] if cuda and dtype_name == "float32" else ["n/a"]):
            cells.append((B, H, dtype_name, mode, tf32))

    env = harness.environment(device)
    env["extension"] = harness.extension_build(seqkernels)
    json_path = args.json or os.path.join(
        "bench_results", f"lstm{'_packed' if args.packed else ''}{'_proj' if args.proj_size else ''}_{device.type}.json")
    document = {"suite": SUITE, "environment": env, "argv": sys.argv[1:] if argv is None else list(argv),
                "ours": OURS, "peer": PEER, "plot_series": ["H"], "records": []}
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

    def label(cell):
        B, H, dtype_name, mode, tf32 = cell
        return f"B={B} H={H} {dtype_name} {mode}" + (f" tf32={tf32}" if tf32 != "n/a" else "")

    def run(i, cell):
        B, H, dtype_name, mode, tf32 = cell
        return run_cell(args, device, env, B, H, dtype_name, mode, tf32, seed=args.seed + i)

    def error_record(cell):
        B, H, dtype_name, mode, tf32 = cell
        return {"suite": SUITE, **env, "T": args.seq_len, "B": B, "I": H, "H": H, "dtype": dtype_name,
                "mode": mode, "tf32": tf32}

    def describe(record):
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
        return " | ".join(parts)

    failed = harness.run_cells("bench_lstm", cells, run, label, error_record, describe, document, json_path, device)
    table = harness.markdown_table(document["records"], columns(device.type))
    heading = (
        f"LSTM small-batch suite on {env['device_name']} ({device.type}, {env['threads']} threads), "
        f"torch {env['torch']}, {env['date']}; T={args.seq_len}, I=H, 1 layer, "
        f"{'PackedSequence (lengths T down to T/2)' if args.packed else 'batch-second'}"
        f"{f', proj_size={args.proj_size}' if args.proj_size else ''}; "
        f"median of {args.iters} interleaved calls after {args.warmup} warm-up."
    )
    return harness.finish("bench_lstm", args, document, json_path, table, heading, failed)


if __name__ == "__main__":
    sys.exit(main())
