"""Next-frame prediction of bouncing shapes with seqkernels.ConvLSTM.

Each sequence shows two shapes (a square or a disc each) moving diagonally, one pixel per
frame along each axis, in a 16x16 frame and bouncing off its walls, drawn on the fly. A
ConvLSTM encoder (seqkernels.ConvLSTM, 2 layers) reads frames 1 .. T-1 and a 1x1
convolution of its output at every step predicts the next frame (per-pixel logits, binary
cross-entropy), trained with Adam. The baseline is the copy-last-frame prediction
(frame t+1 := frame t), which is wrong wherever a shape moved (about three quarters of a
shape's pixels change from one frame to the next); beating it needs the model to infer the
velocities from the frames it has seen and to know about the walls.

    python examples/convlstm_next_frame.py [--steps 300] [--device cuda]

Prints the loss, the time per training step, and the mean squared error of the prediction
on fresh sequences against the copy-last-frame baseline's (both on the frames predicted
after two frames of context: from one frame alone the velocity cannot be known), and a
blank frame's for scale; exits with status 1 if the model does not beat the copy-last-frame
baseline.

Shape legend: B batch, T frames, C hidden channels, S frame side (S x S pixels).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn

import seqkernels

SIDE = 16  # S: frames are S x S
FRAMES = 10  # T
SHAPES = 2  # moving shapes per sequence
CONTEXT = 2  # frames seen before a prediction is scored
SPEEDS = (-1, 1)  # pixels per frame, per axis


def bouncing_shapes(batch: int, generator: torch.Generator) -> torch.Tensor:
    """[B, T, 1, S, S] frames in {0, 1}: SHAPES shapes per sequence, each a 4x4 square or a
    disc of radius 2, at a velocity of SPEEDS pixels per frame per axis, bouncing off the
    walls (the position is reflected at the edge and that velocity component flips)."""
    size = 5  # the box a shape lives in (the disc's diameter)
    top = SIDE - size  # the largest corner coordinate that keeps the shape inside
    speeds = torch.tensor(SPEEDS)
    pos = torch.randint(0, top + 1, (batch, SHAPES, 2), generator=generator)  # (row, col) of the box corner
    vel = speeds[torch.randint(0, len(SPEEDS), (batch, SHAPES, 2), generator=generator)]
    disc = torch.rand(batch, SHAPES, generator=generator) < 0.5
    # The two sprites in their 5x5 box: a 4x4 square in its corner, a disc of radius 2.
    r = torch.arange(size)
    square = ((r[:, None] < 4) & (r[None, :] < 4)).float()
    round_ = (((r[:, None] - 2) ** 2 + (r[None, :] - 2) ** 2) <= 4).float()
    sprite = torch.where(disc[..., None, None], round_, square)  # [B, SHAPES, 5, 5]
    frames = torch.zeros(batch, FRAMES, SIDE + size, SIDE + size)  # padded so a paste never clips
    rows = torch.arange(batch)[:, None, None]
    for t in range(FRAMES):
        for k in range(SHAPES):
            y = pos[:, k, 0, None, None] + r[None, :, None]
            x = pos[:, k, 1, None, None] + r[None, None, :]
            canvas = frames[:, t]
            canvas[rows, y, x] = torch.maximum(canvas[rows, y, x], sprite[:, k])
        pos = pos + vel
        low, high = pos < 0, pos > top  # reflect at the walls
        pos = torch.where(low, -pos, torch.where(high, 2 * top - pos, pos))
        vel = torch.where(low | high, -vel, vel)
    return frames[:, :, None, :SIDE, :SIDE].contiguous()


class NextFrame(nn.Module):
    """ConvLSTM encoder (batch-first) -> 1x1 conv head: frame logits for the next step."""

    def __init__(self, hidden: int = 16, layers: int = 2, kernel_size: int = 3):
        super().__init__()
        self.encoder = seqkernels.ConvLSTM(1, hidden, kernel_size, num_layers=layers, batch_first=True)
        self.head = nn.Conv2d(hidden, 1, 1)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:  # [B, T, 1, S, S] -> [B, T, 1, S, S]
        y, _ = self.encoder(frames)  # [B, T, C, S, S]
        B, T = y.shape[:2]
        return self.head(y.flatten(0, 1)).unflatten(0, (B, T))


def evaluate(model: nn.Module, generator: torch.Generator, device, batch: int = 256) -> tuple[float, float]:
    """Mean squared error of the model's and of copy-last-frame's next-frame predictions on
    fresh sequences, over the frames predicted after CONTEXT frames, and the error of a blank
    frame (predicting no shape at all: the scale of the numbers)."""
    frames = bouncing_shapes(batch, generator).to(device)
    inputs, targets = frames[:, :-1], frames[:, 1:]
    with torch.no_grad():
        predicted = torch.sigmoid(model(inputs))
    scored = slice(CONTEXT - 1, None)  # prediction j is of frame j + 1 after seeing frames 0 .. j
    model_mse = (predicted[:, scored] - targets[:, scored]).pow(2).mean().item()
    copy_mse = (inputs[:, scored] - targets[:, scored]).pow(2).mean().item()
    blank_mse = targets[:, scored].pow(2).mean().item()
    return model_mse, copy_mse, blank_mse


def main(steps: int = 300, batch: int = 16, device: str = "cpu", seed: int = 0) -> dict:
    torch.manual_seed(seed)
    train_gen = torch.Generator().manual_seed(seed)
    model = NextFrame().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, start = [], time.perf_counter()
    for _ in range(steps):
        frames = bouncing_shapes(batch, train_gen).to(device)
        logits = model(frames[:, :-1])
        loss = nn.functional.binary_cross_entropy_with_logits(logits, frames[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / max(steps, 1)
    model_mse, copy_mse, blank_mse = evaluate(model, torch.Generator().manual_seed(seed + 1), device)
    return {"losses": losses, "seconds_per_step": seconds,
            "mse": model_mse, "copy_last_mse": copy_mse, "blank_mse": blank_mse}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    out = main(args.steps, args.batch, args.device)
    losses = out["losses"]
    curve = " ".join(f"{losses[i]:.3f}" for i in range(0, len(losses), max(1, len(losses) // 10)))
    print(f"bouncing shapes, {SIDE}x{SIDE} frames, T={FRAMES}, batch {args.batch}, {args.device}")
    print(f"loss {curve} -> {losses[-1]:.3f}   {1e3 * out['seconds_per_step']:.1f} ms/step")
    print(f"next-frame MSE on fresh sequences: ConvLSTM {out['mse']:.4f}, "
          f"copy-last-frame baseline {out['copy_last_mse']:.4f} "
          f"({out['copy_last_mse'] / out['mse']:.1f}x the model's), "
          f"blank frame {out['blank_mse']:.4f}")
    if not out["mse"] < out["copy_last_mse"]:
        print("FAILED: the ConvLSTM does not beat the copy-last-frame baseline", file=sys.stderr)
        sys.exit(1)
