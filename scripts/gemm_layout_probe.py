"""Times the LSTM step GEMMs in the layouts cuBLAS could be given them (not a test).

The backward's deep-K GEMM dh[B, H] = dG[B, 4H] · W_hh[4H, H] is the slowest step GEMM of the
cuBLAS loop at fp32 (TF32), B = 16, H = 1024. This script measures it as the loop issues it
(W_hh row-major, "NN" in cuBLAS's column-major terms) against a transposed copy of W_hh
("TN", K contiguous in both operands, the layout of the forward's h·W_hhᵀ), next to the
forward GEMM, each as 16 calls replayed from a CUDA graph (the replayed loop's setting),
through cuBLAS and cuBLASLt.

    python scripts/gemm_layout_probe.py [--batch 1 16 64] [--hidden 512 1024]
    python scripts/gemm_layout_probe.py --x3 [--batch 32 64 128] [--hidden 512 1024]

--x3: float32 without TF32, dh as the loop issues it (a float32 GEMM, NN) against split TF32
GEMMs on exact parts: stacked as the forward's x3 steps stack theirs (A [2B, 2·4H], W's two
parts along K) and in three parts along K (A [B, 3·4H]), each with W's parts as stored (NN) and
transposed (TN, K contiguous in both operands, as Hopper's TF32 kernels want them).
"""

import argparse

import torch


def time_graph(fn, reps=16, rounds=30):
    """µs per call of fn, replayed `reps` at a time from one CUDA graph (median of rounds)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    times.sort()
    return times[len(times) // 2]


def kernel_names(fn):
    """The names of the CUDA kernels (and memsets) one call of fn launches."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return " + ".join(n[:90] for n in names)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--hidden", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--kernels", action="store_true", help="also print the kernels each GEMM ran")
    parser.add_argument("--x3", action="store_true", help="float32 without TF32: dh as split TF32 GEMMs")
    args = parser.parse_args()
    if args.x3:
        return x3_table(args)
    torch.backends.cuda.matmul.allow_tf32 = True
    print(torch.cuda.get_device_name(), torch.__version__)
    print("| library | dtype | B | H | fwd h·W_hhᵀ µs | bwd dG·W_hh (NN) µs | bwd dG·(W_hhᵀ)ᵀ (TN) µs |")
    print("|:--|:--|--:|--:|--:|--:|--:|")
    for library in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(library)
        for dtype in (getattr(torch, name) for name in args.dtype):
            for H in args.hidden:
                w = torch.randn(4 * H, H, device="cuda", dtype=dtype) / H**0.5
                w_t = w.t().contiguous()  # [H, 4H]
                for B in args.batch:
                    h = torch.randn(B, H, device="cuda", dtype=dtype)
                    dG = torch.randn(B, 4 * H, device="cuda", dtype=dtype)
                    rec = torch.empty(B, 4 * H, device="cuda", dtype=dtype)
                    dh = torch.empty(B, H, device="cuda", dtype=dtype)
                    fwd = time_graph(lambda: torch.mm(h, w.t(), out=rec))
                    nn = time_graph(lambda: torch.mm(dG, w, out=dh))
                    tn = time_graph(lambda: torch.mm(dG, w_t.t(), out=dh))
                    print(f"| {library} | {str(dtype)[6:]} | {B} | {H} | {fwd:.2f} | {nn:.2f} | {tn:.2f} |", flush=True)
                    if args.kernels:
                        for name, fn in (("fwd", lambda: torch.mm(h, w.t(), out=rec)),
                                         ("NN", lambda: torch.mm(dG, w, out=dh)),
                                         ("TN", lambda: torch.mm(dG, w_t.t(), out=dh))):
                            print(f"    {name}: {kernel_names(fn)}", flush=True)


def x3_table(args):
    """dh = dG·W_hh in float32 against split TF32 GEMMs (module docstring), cuBLASLt."""
    torch.backends.cuda.preferred_blas_library("cublaslt")
    print(torch.cuda.get_device_name(), torch.__version__)
    print("| B | H | float32 NN µs | stacked NN | stacked TN | 3 parts NN | 3 parts TN | stacked TN, 4 K parts"
          " | fp16 stacked NN | fp16 stacked NN, 4 K parts | fp16, 8 K parts |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for H in args.hidden:
        G = 4 * H
        w = torch.randn(G, H, device="cuda") / H**0.5
        w2 = torch.randn(2 * G, H, device="cuda")  # parts along K, as stored
        w2_t = w2.t().contiguous()  # [H, 2G]: K contiguous
        w3 = torch.randn(3 * G, H, device="cuda")
        w3_t = w3.t().contiguous()
        w2h = w2.half()
        for B in args.batch:
            dG = torch.randn(B, G, device="cuda")
            a2 = torch.randn(2 * B, 2 * G, device="cuda")
            a3 = torch.randn(B, 3 * G, device="cuda")
            dh = torch.empty(B, H, device="cuda")
            dh2 = torch.empty(2 * B, H, device="cuda")
            a2h = a2.half()

            def parts(p, half):
                """The stacked GEMM as p K parts of one strided batch (the loop's ReplayGemm)."""
                kp = 2 * G // p
                a = (a2h if half else a2).as_strided((p, 2 * B, kp), (kp, 2 * G, 1))
                if half:
                    b = w2h.as_strided((p, kp, H), (kp * H, H, 1))
                else:
                    b = w2_t.as_strided((p, H, kp), (kp, 2 * G, 1)).transpose(1, 2)
                out = torch.empty(p, 2 * B, H, device="cuda", dtype=torch.half if half else torch.float)
                return lambda: torch.bmm(a, b, out=out)
            calls = {
                "fp32": (False, lambda: torch.mm(dG, w, out=dh)),
                "stacked NN": (True, lambda: torch.mm(a2, w2, out=dh2)),
                "stacked TN": (True, lambda: torch.mm(a2, w2_t.t(), out=dh2)),
                "3 NN": (True, lambda: torch.mm(a3, w3, out=dh)),
                "3 TN": (True, lambda: torch.mm(a3, w3_t.t(), out=dh)),
                "stacked TN 4": (True, parts(4, False)),
                "fp16 stacked NN": (True, lambda: torch.mm(a2h, w2h)),
                "fp16 4": (True, parts(4, True)),
                "fp16 8": (True, parts(8, True)),
            }
            times = []
            for name, (tf32, fn) in calls.items():
                torch.backends.cuda.matmul.allow_tf32 = tf32
                times.append(time_graph(fn))
                if args.kernels:
                    print(f"    {name}: {kernel_names(fn)}", flush=True)
            print(f"| {B} | {H} | " + " | ".join(f"{t:.2f}" for t in times) + " |", flush=True)


if __name__ == "__main__":
    main()
