"""The ConvLSTM suite (issue 6, /work/shared/performance.md): seqkernels.ConvLSTM against
a pure-PyTorch ConvLSTM loop written the way the widely used implementations write it,
with the same weights and tensors, in the same process, measurements interleaved.

The peer ("PyTorch loop", PeerConvLSTM below): per step one nn.Conv2d of
cat([x_t, h_{t-1}], dim=1) to 4C channels, split into i, f, o, g, then the gate math
(sigmoid / tanh, c_t = f c + i g, h_t = o tanh(c_t)), outputs stacked over time,
batch-first, as in e.g. ndrplz/ConvLSTM_pytorch. seqkernels.ConvLSTM (one layer, batch-first)
gets the peer's weights through ConvLSTM.load_concat_conv_weights, so both compute the
same function.

Shapes (B, T, Ci, C, H, W, K), 'same' zero padding, bias, random x, h0 and c0 (never zeros),
the peer's nn.Conv2d initialisation:
  (16, 10, 16, 64, 16, 16, 5)
  (4, 20, 64, 64, 64, 64, 3)

Modes:
  infer  forward under torch.no_grad(), the whole sequence
  train  forward + backward of y.float().sum(), all gradients (weights, bias, the input);
         gradients cleared (set to None) before every call, untimed

On a GPU: cuDNN benchmark mode on for both (--no-cudnn-benchmark to turn it off); float32
rows with PyTorch's defaults (cuDNN TF32 on, matmul TF32 off) unless --tf32 off|both, the
switches recorded per row; both candidates also captured in a CUDA graph (infer), and the
peak memory of one call of each (torch.cuda.max_memory_allocated above what was allocated
before). On the CPU the peak memory is the resident set's growth during one call after an
untimed one, each candidate in a child process of this script whose malloc unmaps freed blocks
(harness.cpu_peak_rss_bytes; Linux).

Targets (speed-up over the loop): GPU infer >= 3x, train >= 2x; CPU >= 1.5x both; peak
memory no higher than the loop's. Before timing, every cell checks both candidates against
a float64 copy of the loop with the same weights (so a wrong weight conversion shows up as
an error of seqkernels; relative error of seqkernels <= 2 * the loop's own + a dtype floor,
outputs and in train every gradient); a cell that fails is not timed, is reported loudly,
and the script exits non-zero.

Examples:
  python benchmarks/bench_convlstm.py                        # both shapes, both modes
  python benchmarks/bench_convlstm.py --quick                # tiny shapes, a smoke run
  python benchmarks/bench_convlstm.py --device cuda --dtype float32 bfloat16 --markdown table.md
  python benchmarks/bench_convlstm.py --shape 4 20 64 64 64 64 3 --mode train
  python benchmarks/bench_convlstm.py --quick --plot convlstm.png   # also a PNG (needs matplotlib)

The table goes to stdout, one progress line per cell to stderr, the records to --json
(default bench_results/convlstm_<device>.json), with --plot PATH.png a figure of the
speed-up and µs per step against B, one line per (T, Ci, C, H, W, K).
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import subprocess
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

seqkernels = harness.import_seqkernels("bench_convlstm")

SUITE = "convlstm"
OURS = "seqkernels"
PEER = "PyTorch loop"
OURS_GRAPH = "seqkernels graph"
PEER_GRAPH = "PyTorch loop graph"
SHAPES = [(16, 10, 16, 64, 16, 16, 5), (4, 20, 64, 64, 64, 64, 3)]  # (B, T, Ci, C, H, W, K)
QUICK_SHAPES = [(2, 4, 3, 8, 8, 8, 3), (2, 3, 4, 8, 6, 10, 5)]  # H != W on purpose
DTYPES = harness.DTYPES
# The correctness check: err(seqkernels) <= 2 * err(loop) + FLOOR[dtype], both against float64.
FLOOR = harness.FLOOR


def target(device: str, mode: str) -> float:
    if device == "cuda":
        return 3.0 if mode == "infer" else 2.0
    return 1.5


# --------------------------------------------------------------------------------------
# The peer: the common ConvLSTM, one convolution of cat([x, h]) per step
# --------------------------------------------------------------------------------------
class PeerConvLSTMCell(nn.Module):
    """One step, as the widely used implementations write it: a single nn.Conv2d over
    cat([x_t, h], dim=1) to 4C channels, split i, f, o, g (their gate order)."""

    def __init__(self, input_channels: int, hidden_channels: int, kernel_size: int, bias: bool = True):
        super().__init__()
        self.hidden_channels = hidden_channels
        self.conv = nn.Conv2d(input_channels + hidden_channels, 4 * hidden_channels, kernel_size,
                              padding=kernel_size // 2, bias=bias)

    def forward(self, x, state):  # x [B, Ci, H, W]; state (h, c) each [B, C, H, W]
        h, c = state
        z = self.conv(torch.cat([x, h], dim=1))  # [B, 4C, H, W]
        zi, zf, zo, zg = torch.split(z, self.hidden_channels, dim=1)
        i, f, o, g = torch.sigmoid(zi), torch.sigmoid(zf), torch.sigmoid(zo), torch.tanh(zg)
        c = f * c + i * g
        h = o * torch.tanh(c)
        return h, c


class PeerConvLSTM(nn.Module):
    """One layer, batch-first: the loop over time of PeerConvLSTMCell, outputs stacked."""

    def __init__(self, input_channels: int, hidden_channels: int, kernel_size: int):
        super().__init__()
        self.cell = PeerConvLSTMCell(input_channels, hidden_channels, kernel_size)

    def forward(self, x, hx):  # x [B, T, Ci, H, W]; hx (h0, c0) each [B, C, H, W]
        h, c = hx
        outputs = []
        for t in range(x.size(1)):
            h, c = self.cell(x[:, t], (h, c))
            outputs.append(h)
        return torch.stack(outputs, dim=1), (h, c)  # [B, T, C, H, W], ([B, C, H, W], [B, C, H, W])


def gates_ifog_to_ifgo(t: torch.Tensor, C: int) -> torch.Tensor:
    """Reorders the gate blocks along dim 0 from the peer's (i, f, o, g) to (i, f, g, o)."""
    i, f, o, g = t.split(C, dim=0)
    return torch.cat([i, f, g, o], dim=0)


# --------------------------------------------------------------------------------------
# One cell
# --------------------------------------------------------------------------------------
class Cell(harness.ModuleCell):
    """The modules and tensors of one (shape, dtype, mode, TF32) cell."""

    def __init__(self, device, shape, dtype, mode, seed):
        B, T, Ci, C, H, W, K = shape
        self.mode, self.C, self.Ci = mode, C, Ci
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        peer = PeerConvLSTM(Ci, C, K)  # nn.Conv2d's own initialisation
        ours = seqkernels.ConvLSTM(Ci, C, K, num_layers=1, bias=True, batch_first=True)
        with torch.no_grad():
            ours.load_concat_conv_weights(0, peer.cell.conv.weight, peer.cell.conv.bias)
        self.peer = peer.to(device=device, dtype=dtype)
        self.ours = ours.to(device=device, dtype=dtype)
        # The float64 reference is the loop itself with the very same (possibly
        # bf16-rounded) weights: independent of load_concat_conv_weights.
        self.ref = copy.deepcopy(self.peer).to(torch.float64)
        self.x = torch.randn(B, T, Ci, H, W, generator=gen).to(device=device, dtype=dtype)
        self.h0 = (0.5 * torch.randn(B, C, H, W, generator=gen)).to(device=device, dtype=dtype)
        self.c0 = (0.5 * torch.randn(B, C, H, W, generator=gen)).to(device=device, dtype=dtype)
        if mode == "train":
            self.x.requires_grad_(True)

    def call(self, module, x, h0, c0):
        """module(x, state) with the state in the module's own layout ([L, B, ...] for
        seqkernels.ConvLSTM); returns (y [B, T, C, H, W], h_T, c_T [B, C, H, W])."""
        if isinstance(module, PeerConvLSTM):
            y, (h, c) = module(x, (h0, c0))
            return y, h, c
        y, (h, c) = module(x, (h0[None], c0[None]))
        return y, h[0], c[0]

    # -- correctness ---------------------------------------------------------------------
    def _results(self, module, x, h0, c0) -> dict[str, torch.Tensor]:
        """Outputs (in train mode also gradients, in seqkernels.ConvLSTM's parameter
        layout) of one call, as float64 tensors."""
        self.clear_grads()
        if self.mode == "infer":
            with torch.no_grad():
                y, h, c = self.call(module, x, h0, c0)
            return {"y": y.double(), "h_T": h.double(), "c_T": c.double()}
        x = x.detach().requires_grad_(True)
        y, h, c = self.call(module, x, h0, c0)
        (y.sum() if y.dtype == torch.float64 else y.float().sum()).backward()
        out = {"y": y.detach().double(), "h_T": h.detach().double(), "c_T": c.detach().double(),
               "grad_x": x.grad.double()}
        if isinstance(module, PeerConvLSTM):  # one conv over cat([x, h]): split and reorder
            gw = gates_ifog_to_ifgo(module.cell.conv.weight.grad.double(), self.C)
            gb = gates_ifog_to_ifgo(module.cell.conv.bias.grad.double(), self.C)
            out.update({"grad_weight_ih_l0": gw[:, : self.Ci], "grad_weight_hh_l0": gw[:, self.Ci:],
                        "grad_bias_ih_l0": gb, "grad_bias_hh_l0": gb})
        else:
            out.update({"grad_" + name: p.grad.double() for name, p in module.named_parameters()})
        return out

    def reference(self) -> dict[str, torch.Tensor]:
        """The loop in float64 with the cell's weights."""
        d = torch.float64
        return self._results(self.ref, self.x.detach().to(d), self.h0.to(d), self.c0.to(d))

    def results(self, module) -> dict[str, torch.Tensor]:
        return self._results(module, self.x.detach(), self.h0, self.c0)


# --------------------------------------------------------------------------------------
# Running the suite
# --------------------------------------------------------------------------------------
def run_cell(args, device, env, shape, dtype_name, mode, tf32, seed) -> dict:
    dtype = DTYPES[dtype_name]
    cuda = device.type == "cuda"
    B, T, Ci, C, H, W, K = shape
    if cuda:
        harness.set_tf32(False if tf32 == "off" else None)
    tf32_active = cuda and dtype == torch.float32 and tf32 != "off"
    record = {
        "suite": SUITE, **env, "seqkernels": seqkernels.__version__,
        "B": B, "T": T, "Ci": Ci, "C": C, "H": H, "W": W, "K": K, "layers": 1, "bias": True, "batch_first": True,
        "dtype": dtype_name, "mode": mode, "tf32": tf32,
        "tf32_flags": harness.tf32_state() if cuda else None,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if cuda else None,
        "warmup": args.warmup, "iters": args.iters,
        "load_avg_before": harness.load_average(), "status": "ok", "target_speedup": target(device.type, mode),
    }  # fmt: skip
    cell = Cell(device, shape, dtype, mode, seed)

    # Correctness, once, before any timing.
    floor = FLOOR["tf32" if tf32_active else dtype_name]
    ref = cell.reference()
    peer_errs = harness.rel_errors(cell.results(cell.peer), ref)
    ours_errs = harness.rel_errors(cell.results(cell.ours), ref)
    failures = harness.check(OURS, ours_errs, peer_errs, floor, "the loop")
    record["rel_error"] = {OURS: ours_errs, PEER: peer_errs, "floor": floor}

    fns = {OURS: cell.fn(cell.ours), PEER: cell.fn(cell.peer)}
    if cuda and mode == "infer" and not args.no_graphs:
        graphs = harness.capture_graphs({PEER_GRAPH: cell.infer_fn(cell.peer), OURS_GRAPH: cell.infer_fn(cell.ours)},
                                        record)
        if OURS_GRAPH in graphs:
            y, h, c = graphs[OURS_GRAPH].replay()
            torch.cuda.synchronize()
            graph_errs = harness.rel_errors({"y": y.double(), "h_T": h.double(), "c_T": c.double()}, ref)
            record["rel_error"][OURS_GRAPH] = graph_errs
            failures += harness.check(OURS_GRAPH, graph_errs, peer_errs, floor, "the loop")
        fns.update(graphs)
    del ref

    if failures:
        record["status"] = "wrong"
        record["error"] = "; ".join(failures)
        return record

    before = cell.clear_grads if mode == "train" else None
    harness.time_candidates(record, fns, device, args, T, before_each=before)
    ms = record["ms"]
    record["speedup"] = {f"{OURS} vs {PEER}": harness.speedup(ms[PEER], ms[OURS])}
    if PEER_GRAPH in ms and OURS_GRAPH in ms:
        record["speedup"][f"{OURS_GRAPH} vs {PEER_GRAPH}"] = harness.speedup(ms[PEER_GRAPH], ms[OURS_GRAPH])
    if cuda:
        # Ours keeps its step graph, the buffers it reads and its result from one call to the next
        # (seqkernels.release_step_graphs): dropped first, so that its peak counts them.
        def before_ours():
            seqkernels.release_step_graphs()
            if before is not None:
                before()

        peaks = {name: harness.peak_memory_bytes(fns[name], device, before=before_ours if name == OURS else before)
                 for name in (OURS, PEER)}
    else:
        peaks = {name: cpu_peak_bytes(args, name, shape, dtype_name, mode, seed) for name in (OURS, PEER)}
    if None not in peaks.values():
        record["peak_mb"] = {name: b / 2**20 for name, b in peaks.items()}
        record["memory_met"] = peaks[OURS] <= peaks[PEER]
    s = record["speedup"][f"{OURS} vs {PEER}"]
    record["target_met"] = s is not None and s >= record["target_speedup"]
    record["load_avg_after"] = harness.load_average()
    return record


def cpu_peak_bytes(args, name, shape, dtype_name, mode, seed) -> int | None:
    """The CPU peak memory of one call of candidate `name` on this cell (same seed, so the same
    weights and inputs): harness.cpu_peak_rss_bytes in a child process of this script."""
    cmd = [sys.executable, os.path.abspath(__file__), "--device", "cpu", "--cpu-memory-probe", name,
           "--shape", *map(str, shape), "--dtype", dtype_name, "--mode", mode, "--seed", str(seed)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    done = subprocess.run(cmd, env=dict(os.environ, **harness.MALLOC_ENV), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"]


def cpu_memory_probe(args) -> int:
    """--cpu-memory-probe NAME: prints {"peak_bytes": ...} of one call of that candidate on the
    one cell of --shape / --dtype / --mode / --seed (run by cpu_peak_bytes in a child)."""
    device = harness.setup_device(args, "bench_convlstm")
    cell = Cell(device, tuple(args.shape[0]), DTYPES[args.dtype[0]], args.mode[0], args.seed)
    module = cell.ours if args.cpu_memory_probe == OURS else cell.peer
    before = cell.clear_grads if args.mode[0] == "train" else None
    print(json.dumps({"peak_bytes": harness.cpu_peak_rss_bytes(cell.fn(module), before)}))
    return 0


def columns(device: str) -> list[harness.Column]:
    cols = [
        harness.Column("B, T, Ci, C, H×W, K", align="left",
                       get=lambda r: f"{r['B']}, {r['T']}, {r['Ci']}, {r['C']}, {r['H']}×{r['W']}, {r['K']}"),
        harness.Column("dtype", lambda r: r["dtype"], align="left"),
    ]
    if device == "cuda":
        cols.append(harness.Column("TF32", lambda r: r["tf32"], align="left"))
    cols += [
        harness.Column("mode", lambda r: r["mode"], align="left"),
        harness.Column("seqkernels ms", lambda r: r["ms"][OURS], "{:.3f}"),
        harness.Column("µs/step", lambda r: r["us_per_step"][OURS], "{:.1f}"),
        harness.Column("loop ms", lambda r: r["ms"][PEER], "{:.3f}"),
        harness.Column("speed-up", lambda r: r["speedup"][f"{OURS} vs {PEER}"], "{:.2f}×"),
    ]
    if device == "cuda":
        cols += [
            harness.Column("seqkernels graph ms", lambda r: r["ms"].get(OURS_GRAPH), "{:.3f}"),
            harness.Column("loop graph ms", lambda r: r["ms"].get(PEER_GRAPH), "{:.3f}"),
            harness.Column("graph vs graph", lambda r: r["speedup"].get(f"{OURS_GRAPH} vs {PEER_GRAPH}"), "{:.2f}×"),
        ]
    # CUDA: the caching allocator's peak; CPU: the resident set's peak (cpu_peak_bytes).
    cols += [
        harness.Column("peak MB (ours / loop)", lambda r: f"{r['peak_mb'][OURS]:.1f} / {r['peak_mb'][PEER]:.1f}"),
        harness.Column("target", harness.target_text, align="left"),
    ]
    return cols


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true",
                   help=f"tiny shapes {QUICK_SHAPES} and 1 warm-up call: a smoke run, not a measurement")
    p.add_argument("--shape", type=int, nargs=7, action="append", metavar=("B", "T", "CI", "C", "H", "W", "K"),
                   help="a shape (repeatable; replaces the suite's two); K odd")
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["float32"],
                   help="default float32; bfloat16 is meant for CUDA")
    p.add_argument("--mode", nargs="+", choices=["infer", "train"], default=["infer", "train"])
    p.add_argument("--no-cudnn-benchmark", action="store_true",
                   help="GPU: leave torch.backends.cudnn.benchmark off (default: on, for both candidates)")
    harness.add_common_args(p, "convlstm_<device>.json", tf32_and_graphs=True)
    p.add_argument("--cpu-memory-probe", choices=[OURS, PEER], help=argparse.SUPPRESS)  # cpu_peak_bytes' child
    args = harness.parse_common(p, argv)
    for shape in args.shape or []:
        if min(shape) < 1 or shape[6] % 2 == 0:
            p.error(f"--shape {shape}: sizes must be >= 1 and K odd")
    if args.quick and args.warmup is None:
        args.warmup = 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpu_memory_probe:
        return cpu_memory_probe(args)
    device = harness.setup_device(args, "bench_convlstm")
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    shapes = [tuple(s) for s in args.shape] if args.shape else (QUICK_SHAPES if args.quick else SHAPES)
    cells = []
    for shape, dtype_name, mode in itertools.product(shapes, args.dtype, args.mode):
        for tf32 in (harness.TF32_ROWS[args.tf32] if cuda and dtype_name == "float32" else ["n/a"]):
            cells.append((shape, dtype_name, mode, tf32))

    env = harness.environment(device)
    json_path = args.json or os.path.join("bench_results", f"convlstm_{device.type}.json")
    document = {"suite": SUITE, "environment": env, "argv": sys.argv[1:] if argv is None else list(argv),
                "ours": OURS, "peer": PEER, "plot_series": ["T", "Ci", "C", "H", "W", "K"], "records": []}
    harness.progress(f"bench_convlstm: {len(cells)} cells on {env['device_name']} ({device}), torch {env['torch']}, "
                     f"{env['threads']} threads, warm-up {args.warmup}, {args.iters} timed calls each")

    def label(cell):
        shape, dtype_name, mode, tf32 = cell
        return f"(B, T, Ci, C, H, W, K)={shape} {dtype_name} {mode}" + (f" tf32={tf32}" if tf32 != "n/a" else "")

    def run(i, cell):
        shape, dtype_name, mode, tf32 = cell
        return run_cell(args, device, env, shape, dtype_name, mode, tf32, seed=args.seed + i)

    def error_record(cell):
        shape, dtype_name, mode, tf32 = cell
        return {"suite": SUITE, **env, "shape": shape, "dtype": dtype_name, "mode": mode, "tf32": tf32}

    def describe(record):
        ms = record["ms"]
        memory = ""
        if "peak_mb" in record:
            memory = f", peak {record['peak_mb'][OURS]:.1f} / {record['peak_mb'][PEER]:.1f} MB"
        return (f"{OURS} {ms[OURS]:.3f} ms, {PEER} {ms[PEER]:.3f} ms, "
                f"speed-up {record['speedup'][f'{OURS} vs {PEER}']:.2f}x (target {record['target_speedup']:g}x){memory}")

    failed = harness.run_cells("bench_convlstm", cells, run, label, error_record, describe, document, json_path,
                               device)
    ok = [r for r in document["records"] if r["status"] == "ok"]
    table = harness.markdown_table(ok, columns(device.type))
    notes = [] if cuda else ["peak MB on the CPU: the resident set's growth during one call after an untimed "
                             "one, each candidate in a child process with glibc's malloc unmapping freed blocks "
                             "(harness.cpu_peak_rss_bytes)"]
    heading = (f"ConvLSTM suite on {env['device_name']} ({device.type}, {env['threads']} threads), "
               f"torch {env['torch']}, {env['date']}; one layer, 'same' zero padding, bias, batch-first; "
               f"median ms per call (B sequences of T steps) of {args.iters} interleaved calls after "
               f"{args.warmup} warm-up; loop = one conv of cat([x, h]) per step + gate math "
               "(benchmarks/bench_convlstm.py, PeerConvLSTM)"
               + ("; cuDNN benchmark mode " + ("off" if args.no_cudnn_benchmark else "on") if cuda else
                  "; peak memory: resident-set growth of one call") + ".")
    return harness.finish("bench_convlstm", args, document, json_path, table, heading, failed, notes)


if __name__ == "__main__":
    sys.exit(main())
