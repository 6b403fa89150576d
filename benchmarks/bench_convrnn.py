"""The ConvRNN suite (issue 5, /work/shared/performance.md): seqkernels.convrnn (the fused
op) against the reference loop of seqkernels/reference/convrnn.py (F.pad + F.conv1d + tanh
per step, the template's public implementation) with the same tensors, in the same
process, measurements interleaved.

Shapes (B, T, C, N, K), circular padding, tanh, with bias, batch-first, random x, h0 and
weights at conv1d's init scale (never zeros):
  (32, 128, 1, 16, 3)   the template's benchmark shape
  (8, 1024, 6, 256, 3)

Modes:
  infer  forward under torch.no_grad(), the whole sequence
  train  forward + backward of y.float().sum() + h_T.float().sum(), all gradients
         (x, h0, weight, bias); gradients cleared before every call, untimed

Targets (speed-up over the reference loop): GPU infer >= 100x, train >= 50x; CPU >= 5x
both. Before timing, every cell checks both candidates against a float64 run of the
reference (relative error <= 2 * the reference's own + a dtype floor); a cell that fails
is not timed, is reported loudly, and the script exits non-zero.

Examples:
  python benchmarks/bench_convrnn.py                         # both shapes, both modes
  python benchmarks/bench_convrnn.py --device cuda --markdown table.md
  python benchmarks/bench_convrnn.py --shape 8 1024 6 256 3 --mode train
  python benchmarks/bench_convrnn.py --plot convrnn.png    # also a PNG (needs matplotlib)

The table goes to stdout, one progress line per cell to stderr, the records to --json
(default bench_results/convrnn_<device>.json), with --plot PATH.png a figure of the
speed-up and µs per step against B, one line per (T, C, N, K).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

seqkernels = harness.import_seqkernels("bench_convrnn")
from seqkernels.reference import convrnn_reference  # noqa: E402

SUITE = "convrnn"
OURS = "seqkernels"
PEER = "reference loop"
SHAPES = [(32, 128, 1, 16, 3), (8, 1024, 6, 256, 3)]
DTYPES = harness.DTYPES
FLOOR = harness.FLOOR


def target(device: str, mode: str) -> float:
    if device == "cuda":
        return 100.0 if mode == "infer" else 50.0
    return 5.0


class Cell:
    """The tensors and callables of one (shape, dtype, mode) cell."""

    def __init__(self, device, shape, dtype, mode, seed):
        B, T, C, N, K = shape
        self.mode = mode
        gen = torch.Generator().manual_seed(seed)
        bound = 1.0 / (C * K) ** 0.5  # conv1d's default init scale
        self.master = {
            "x": torch.randn(B, T, C, N, generator=gen, dtype=torch.float64),
            "weight": (torch.rand(C, C, K, generator=gen, dtype=torch.float64) * 2 - 1) * bound,
            "h0": torch.randn(B, C, N, generator=gen, dtype=torch.float64),
            "bias": (torch.rand(C, generator=gen, dtype=torch.float64) * 2 - 1) * bound,
        }
        self.t = {k: v.to(device=device, dtype=dtype).requires_grad_(mode == "train") for k, v in self.master.items()}

    def fn(self, impl):
        t = self.t

        def infer():
            with torch.no_grad():
                return impl(t["x"], t["weight"], t["h0"], t["bias"], "circular", "tanh")

        def train():
            y, h_T = impl(t["x"], t["weight"], t["h0"], t["bias"], "circular", "tanh")
            (y.float().sum() + h_T.float().sum()).backward()
            return y

        return infer if self.mode == "infer" else train

    def clear_grads(self):
        for v in self.t.values():
            v.grad = None

    def results(self, impl, tensors) -> dict[str, torch.Tensor]:
        leaves = {k: v.detach().clone().requires_grad_(self.mode == "train") for k, v in tensors.items()}
        with torch.set_grad_enabled(self.mode == "train"):
            y, h_T = impl(leaves["x"], leaves["weight"], leaves["h0"], leaves["bias"], "circular", "tanh")
        out = {"y": y.detach().double(), "h_T": h_T.detach().double()}
        if self.mode == "train":
            (y.double().sum() + h_T.double().sum()).backward()
            out.update({f"grad_{k}": v.grad.double() for k, v in leaves.items()})
        return out


def run_cell(args, device, env, shape, dtype_name, mode, seed) -> dict:
    dtype = DTYPES[dtype_name]
    B, T, C, N, K = shape
    record = {
        "suite": SUITE, **env, "seqkernels": seqkernels.__version__,
        "B": B, "T": T, "C": C, "N": N, "K": K, "padding_mode": "circular", "nonlinearity": "tanh", "bias": True,
        "dtype": dtype_name, "mode": mode, "warmup": args.warmup, "iters": args.iters,
        "load_avg_before": harness.load_average(), "status": "ok", "target_speedup": target(device.type, mode),
    }  # fmt: skip
    if device.type == "cuda":
        harness.set_tf32(False)  # float32 is float32 on both sides (the reference's conv1d too)
        record["tf32_flags"] = harness.tf32_state()
    cell = Cell(device, shape, dtype, mode, seed)

    # Correctness first, against the reference in float64 on the same device.
    ref = cell.results(convrnn_reference, {k: v.to(device) for k, v in cell.master.items()})
    errs = {name: harness.rel_errors(cell.results(impl, cell.t), ref)
            for name, impl in ((OURS, seqkernels.convrnn), (PEER, convrnn_reference))}
    record["rel_errors"] = errs
    bad = harness.check(OURS, errs[OURS], errs[PEER], FLOOR[dtype_name], PEER)
    if bad:
        record["status"] = "wrong"
        record["error"] = "; ".join(bad)
        return record

    fns = {OURS: cell.fn(seqkernels.convrnn), PEER: cell.fn(convrnn_reference)}
    harness.time_candidates(record, fns, device, args, T, before_each=cell.clear_grads)
    s = harness.speedup(record["ms"][PEER], record["ms"][OURS])
    record["speedup"] = s
    record["target_met"] = s is not None and s >= record["target_speedup"]
    record["load_avg_after"] = harness.load_average()
    return record


def columns() -> list[harness.Column]:
    return [
        harness.Column("B, T, C, N, K", lambda r: f"{r['B']}, {r['T']}, {r['C']}, {r['N']}, {r['K']}", align="left"),
        harness.Column("dtype", lambda r: r["dtype"], align="left"),
        harness.Column("mode", lambda r: r["mode"], align="left"),
        harness.Column("seqkernels ms", lambda r: r["ms"][OURS], "{:.3f}"),
        harness.Column("µs/step", lambda r: r["us_per_step"][OURS], "{:.2f}"),
        harness.Column("reference ms", lambda r: r["ms"][PEER], "{:.3f}"),
        harness.Column("ref µs/step", lambda r: r["us_per_step"][PEER], "{:.1f}"),
        harness.Column("speed-up", lambda r: r["speedup"], "{:.1f}×"),
        harness.Column("target", harness.target_text, align="left"),
    ]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--shape", type=int, nargs=5, action="append", metavar=("B", "T", "C", "N", "K"),
                   help="a shape (repeatable; replaces the suite's two)")
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["float32"])
    p.add_argument("--mode", nargs="+", choices=["infer", "train"], default=["infer", "train"])
    harness.add_common_args(p, "convrnn_<device>.json")
    return harness.parse_common(p, argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = harness.setup_device(args, "bench_convrnn")
    shapes = [tuple(s) for s in args.shape] if args.shape else SHAPES
    cells = list(itertools.product(shapes, args.dtype, args.mode))

    env = harness.environment(device)
    json_path = args.json or os.path.join("bench_results", f"convrnn_{device.type}.json")
    document = {"suite": SUITE, "environment": env, "argv": sys.argv[1:] if argv is None else list(argv),
                "ours": OURS, "peer": PEER, "plot_series": ["T", "C", "N", "K"], "records": []}
    harness.progress(f"bench_convrnn: {len(cells)} cells on {env['device_name']} ({device}), torch {env['torch']}, "
                     f"{env['threads']} threads, warm-up {args.warmup}, {args.iters} timed calls each")

    def run(i, cell):
        shape, dtype_name, mode = cell
        return run_cell(args, device, env, shape, dtype_name, mode, seed=args.seed + i)

    def error_record(cell):
        shape, dtype_name, mode = cell
        return {"suite": SUITE, **env, "shape": shape, "dtype": dtype_name, "mode": mode}

    def describe(record):
        ms = record["ms"]
        return (f"{OURS} {ms[OURS]:.3f} ms, {PEER} {ms[PEER]:.3f} ms, "
                f"speed-up {record['speedup']:.1f}x (target {record['target_speedup']:g}x)")

    failed = harness.run_cells("bench_convrnn", cells, run,
                               lambda cell: f"(B, T, C, N, K)={cell[0]} {cell[1]} {cell[2]}",
                               error_record, describe, document, json_path, device)
    ok = [r for r in document["records"] if r["status"] == "ok"]
    table = harness.markdown_table(ok, columns())
    heading = (f"ConvRNN suite on {env['device_name']} ({device.type}, {env['threads']} threads), "
               f"torch {env['torch']}, {env['date']}; circular padding, tanh, bias; median of {args.iters} "
               f"interleaved calls after {args.warmup} warm-up; reference = the loop of "
               "seqkernels/reference/convrnn.py.")
    return harness.finish("bench_convrnn", args, document, json_path, table, heading, failed)


if __name__ == "__main__":
    sys.exit(main())
