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

The table goes to stdout, one progress line per cell to stderr, the records to --json
(default bench_results/convrnn_<device>.json).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

try:
    import seqkernels  # noqa: E402
    from seqkernels.reference import convrnn_reference  # noqa: E402
except ImportError as exc:  # the package raises with the reason when _C is missing
    raise SystemExit(
        f"bench_convrnn: cannot import seqkernels ({exc}).\n"
        "Build it first: pip install --no-build-isolation --no-deps -e ."
    ) from exc

SUITE = "convrnn"
OURS = "seqkernels"
PEER = "reference loop"
SHAPES = [(32, 128, 1, 16, 3), (8, 1024, 6, 256, 3)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
FLOOR = {"float64": 1e-9, "float32": 1e-4, "float16": 5e-3, "bfloat16": 3e-2}


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


def rel_errors(got, ref):
    return {k: (got[k] - r).abs().max().item() / max(r.abs().max().item(), 1e-30) for k, r in ref.items()}


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
    errs = {name: rel_errors(cell.results(impl, cell.t), ref)
            for name, impl in ((OURS, seqkernels.convrnn), (PEER, convrnn_reference))}
    record["rel_errors"] = errs
    bad = [f"{k}: {e:.3g} > {2 * errs[PEER][k] + FLOOR[dtype_name]:.3g}"
           for k, e in errs[OURS].items() if not e <= 2 * errs[PEER][k] + FLOOR[dtype_name]]
    if bad:
        record["status"] = "wrong"
        record["error"] = "; ".join(bad)
        return record

    fns = {OURS: cell.fn(seqkernels.convrnn), PEER: cell.fn(convrnn_reference)}
    other = harness.OtherLoad()
    timings = harness.measure_interleaved(fns, device, warmup=args.warmup, iters=args.iters,
                                          before_each=cell.clear_grads)
    record["other_load_cores"] = other.cores()
    record["timings"] = {k: t.summary() for k, t in timings.items()}
    record["ms"] = {k: t.median_ms for k, t in timings.items()}
    record["us_per_step"] = {k: v * 1e3 / T for k, v in record["ms"].items()}
    s = harness.speedup(record["ms"][PEER], record["ms"][OURS])
    record["speedup"] = s
    record["target_met"] = s is not None and s >= record["target_speedup"]
    record["load_avg_after"] = harness.load_average()
    return record


def columns() -> list[harness.Column]:
    def met(r):
        if r["status"] != "ok":
            return r["status"].upper()
        text = f"≥{r['target_speedup']:g}× " + ("yes" if r["target_met"] else "**no**")
        other = r.get("other_load_cores")
        if other is not None and other > 0.1:
            text += f" (noisy: {other:.1f} other cores busy)"
        return text

    return [
        harness.Column("B, T, C, N, K", lambda r: f"{r['B']}, {r['T']}, {r['C']}, {r['N']}, {r['K']}", align="left"),
        harness.Column("dtype", lambda r: r["dtype"], align="left"),
        harness.Column("mode", lambda r: r["mode"], align="left"),
        harness.Column("seqkernels ms", lambda r: r["ms"][OURS], "{:.3f}"),
        harness.Column("µs/step", lambda r: r["us_per_step"][OURS], "{:.2f}"),
        harness.Column("reference ms", lambda r: r["ms"][PEER], "{:.3f}"),
        harness.Column("ref µs/step", lambda r: r["us_per_step"][PEER], "{:.1f}"),
        harness.Column("speed-up", lambda r: r["speedup"], "{:.1f}×"),
        harness.Column("target", met, align="left"),
    ]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--shape", type=int, nargs=5, action="append", metavar=("B", "T", "C", "N", "K"),
                   help="a shape (repeatable; replaces the suite's two)")
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["float32"])
    p.add_argument("--mode", nargs="+", choices=["infer", "train"], default=["infer", "train"])
    p.add_argument("--warmup", type=int, default=None, help="untimed calls per candidate (default 3 CPU, 10 GPU)")
    p.add_argument("--iters", type=int, default=None,
                   help=f"timed calls per candidate, >= {harness.MIN_TIMED_CALLS} (default 20 CPU, 50 GPU)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="records file (default bench_results/convrnn_<device>.json)")
    p.add_argument("--markdown", default=None, help="also write the table (with a heading) to this file")
    args = p.parse_args(argv)
    if args.iters is not None and args.iters < harness.MIN_TIMED_CALLS:
        p.error(f"--iters must be >= {harness.MIN_TIMED_CALLS}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = harness.setup_device(args, "bench_convrnn")
    cuda = device.type == "cuda"
    shapes = [tuple(s) for s in args.shape] if args.shape else SHAPES
    cells = list(itertools.product(shapes, args.dtype, args.mode))

    env = harness.environment(device)
    json_path = args.json or os.path.join("bench_results", f"convrnn_{device.type}.json")
    document = {"suite": SUITE, "environment": env, "argv": sys.argv[1:], "records": []}
    harness.progress(f"bench_convrnn: {len(cells)} cells on {env['device_name']} ({device}), torch {env['torch']}, "
                     f"{env['threads']} threads, warm-up {args.warmup}, {args.iters} timed calls each")
    failed = 0
    t_start = time.perf_counter()
    for i, (shape, dtype_name, mode) in enumerate(cells):
        label = f"(B, T, C, N, K)={shape} {dtype_name} {mode}"
        try:
            record = run_cell(args, device, env, shape, dtype_name, mode, seed=args.seed + i)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            record = {"suite": SUITE, **env, "shape": shape, "dtype": dtype_name, "mode": mode,
                      "status": "error", "error": f"{type(exc).__name__}: {exc}"}
        document["records"].append(record)
        harness.write_json(json_path, document)
        head = f"[{i + 1}/{len(cells)}] {label}:"
        if record["status"] != "ok":
            failed += 1
            harness.progress(f"{'!' * 78}\n{head} {record['status'].upper()}: {record.get('error')}\n{'!' * 78}")
            continue
        ms = record["ms"]
        harness.progress(f"{head} {OURS} {ms[OURS]:.3f} ms, {PEER} {ms[PEER]:.3f} ms, "
                         f"speed-up {record['speedup']:.1f}x (target {record['target_speedup']:g}x)")
    ok = [r for r in document["records"] if r["status"] == "ok"]
    table = harness.markdown_table(ok, columns())
    document["elapsed_s"] = time.perf_counter() - t_start
    harness.write_json(json_path, document)
    print(table)
    harness.progress(f"bench_convrnn: {len(cells) - failed}/{len(cells)} cells ok in {document['elapsed_s']:.0f} s; "
                     f"records in {json_path}")
    if args.markdown:
        heading = (f"ConvRNN suite on {env['device_name']} ({device.type}, {env['threads']} threads), "
                   f"torch {env['torch']}, {env['date']}; circular padding, tanh, bias; median of {args.iters} "
                   f"interleaved calls after {args.warmup} warm-up; reference = the loop of "
                   "seqkernels/reference/convrnn.py.")
        os.makedirs(os.path.dirname(os.path.abspath(args.markdown)), exist_ok=True)
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(heading + "\n\n" + table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
