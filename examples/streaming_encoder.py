"""Streaming inference of an RNN-T style LSTM encoder: audio-feature frames arrive in
chunks, and each chunk runs through a stacked LSTM that carries its (h, c) from the previous
chunk, so the streamed output equals the output over the whole utterance. Reports the
latency per chunk for torch.nn.LSTM and for seqkernels.LSTM with the same weights.

    python examples/streaming_encoder.py [--chunk 8] [--device cuda]
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import seqkernels

FEATURES, HIDDEN, LAYERS, PROJ = 80, 320, 3, 160


def stream(encoder: nn.Module, frames: torch.Tensor, chunk: int) -> tuple[torch.Tensor, list[float]]:
    """frames [T, 1, FEATURES] -> encoder output [T, 1, PROJ], and seconds per chunk."""
    state, outputs, latencies = None, [], []
    with torch.no_grad():
        for start in range(0, frames.shape[0], chunk):
            t0 = time.perf_counter()
            out, state = encoder(frames[start : start + chunk], state)
            if frames.is_cuda:
                torch.cuda.synchronize()
            latencies.append(time.perf_counter() - t0)
            outputs.append(out)
    return torch.cat(outputs), latencies


def main(chunk: int = 8, frames: int = 200, device: str = "cpu") -> dict:
    torch.manual_seed(0)
    reference = nn.LSTM(FEATURES, HIDDEN, num_layers=LAYERS, proj_size=PROJ).to(device).eval()
    ours = seqkernels.LSTM(FEATURES, HIDDEN, num_layers=LAYERS, proj_size=PROJ, device=device).eval()
    ours.load_state_dict(reference.state_dict())
    utterance = torch.randn(frames, 1, FEATURES, device=device)
    with torch.no_grad():
        whole, _ = ours(utterance)
    results = {}
    for name, encoder in (("nn.LSTM", reference), ("seqkernels.LSTM", ours)):
        stream(encoder, utterance[: 2 * chunk], chunk)  # warm-up
        streamed, latencies = stream(encoder, utterance, chunk)
        results[name] = {
            "max_diff_vs_whole_utterance": (streamed - whole).abs().max().item(),
            "median_ms_per_chunk": 1e3 * sorted(latencies)[len(latencies) // 2],
        }
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk", type=int, default=8, help="frames per chunk")
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    for name, r in main(args.chunk, args.frames, args.device).items():
        print(f"{name:16s} {r['median_ms_per_chunk']:.3f} ms per {args.chunk}-frame chunk; "
              f"max |streamed - whole utterance| = {r['max_diff_vs_whole_utterance']:.1e}")
