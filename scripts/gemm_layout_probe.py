"""Times the LSTM step GEMMs in the layouts cuBLAS could be given them (not a test).

The backward's deep-K GEMM dh[B, H] = dG[B, 4H] · W_hh[4H, H] is the slowest step GEMM of the
cuBLAS loop at fp32 (TF32), B = 16, H = 1024. This script measures it as the loop issues it
(W_hh row-major, "NN" in cuBLAS's column-major terms) against a transposed copy of W_hh
("TN", K contiguous in both operands, the layout of the forward's h·W_hhᵀ), next to the
forward GEMM, each as 16 calls replayed from a CUDA graph (the replayed loop's setting),
through cuBLAS and cuBLASLt.

    python scripts/gemm_layout_probe.py [--batch 1 16 64] [--hidden 512 1024]
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
