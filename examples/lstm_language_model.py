"""A word-level LSTM language model (embedding, 2-layer LSTM with dropout, tied decoder)
trained on a small text shipped in the repo (examples/data/alice.txt, the public-domain
opening of Lewis Carroll's "Alice's Adventures in Wonderland"), once with torch.nn.LSTM and
once after seqkernels.replace_lstm swapped in seqkernels.LSTM with the same weights.

    python examples/lstm_language_model.py [--steps 200] [--device cuda]

Prints both loss curves and the time per training step.
"""
from __future__ import annotations

import argparse
import copy
import pathlib
import re
import time

import torch
from torch import nn

import seqkernels

TEXT = pathlib.Path(__file__).with_name("data") / "alice.txt"


class WordLM(nn.Module):
    """Embedding -> 2-layer LSTM (dropout between layers) -> decoder tied to the embedding."""

    def __init__(self, vocab: int, width: int = 128, dropout: float = 0.2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, dropout=dropout, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(width, vocab)
        self.decoder.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, vocab]
        y, _ = self.lstm(self.drop(self.embed(tokens)))
        return self.decoder(self.drop(y))


def corpus(device: str) -> tuple[torch.Tensor, int]:
    words = re.findall(r"[a-z]+|[^\sa-z]", TEXT.read_text().lower())
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    return torch.tensor([vocab[w] for w in words], device=device), len(vocab)


def batches(ids: torch.Tensor, steps: int, batch: int, seq: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=generator).tolist()
        window = torch.stack([ids[s : s + seq + 1] for s in starts])
        yield window[:, :-1], window[:, 1:]


def train(model: nn.Module, ids: torch.Tensor, vocab: int, steps: int, seed: int = 0) -> tuple[list[float], float]:
    torch.manual_seed(seed)  # same dropout masks for both runs' non-LSTM dropout
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, start = [], time.perf_counter()
    for inputs, targets in batches(ids, steps, batch=16, seq=32, seed=seed):
        loss = nn.functional.cross_entropy(model(inputs).reshape(-1, vocab), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if ids.is_cuda:
        torch.cuda.synchronize()
    return losses, (time.perf_counter() - start) / steps


def main(steps: int = 200, device: str = "cpu") -> dict:
    ids, vocab = corpus(device)
    torch.manual_seed(0)
    reference = WordLM(vocab).to(device)
    ours = seqkernels.replace_lstm(copy.deepcopy(reference))
    assert isinstance(ours.lstm, seqkernels.LSTM)
    with torch.no_grad():  # same weights: same predictions before training
        reference.eval(), ours.eval()
        probe = ids[:64].reshape(2, 32)
        max_diff = (reference(probe) - ours(probe)).abs().max().item()
        reference.train(), ours.train()
    results = {"max_logit_diff_before_training": max_diff}
    for name, model in (("nn.LSTM", reference), ("seqkernels.LSTM", ours)):
        losses, seconds = train(model, ids, vocab, steps)
        results[name] = {"losses": losses, "seconds_per_step": seconds}
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    out = main(args.steps, args.device)
    print(f"max |logit difference| before training: {out['max_logit_diff_before_training']:.2e}")
    for name in ("nn.LSTM", "seqkernels.LSTM"):
        losses = out[name]["losses"]
        curve = " ".join(f"{losses[i]:.2f}" for i in range(0, len(losses), max(1, len(losses) // 10)))
        print(f"{name:16s} loss {curve} -> {losses[-1]:.2f}   {1e3 * out[name]['seconds_per_step']:.1f} ms/step")
