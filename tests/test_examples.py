"""The examples run (small settings) and show what they claim."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_language_model_trains_with_both_lstms():
    out = load("lstm_language_model").main(steps=12)
    assert out["max_logit_diff_before_training"] < 1e-4  # replace_lstm kept the weights
    for name in ("nn.LSTM", "seqkernels.LSTM"):
        losses = out[name]["losses"]
        assert len(losses) == 12 and losses[-1] < losses[0] - 0.5, (name, losses)


@pytest.mark.parametrize("chunk", [1, 7])
def test_streaming_equals_whole_utterance(chunk):
    out = load("streaming_encoder").main(chunk=chunk, frames=30)
    for name in ("nn.LSTM", "seqkernels.LSTM"):
        assert out[name]["max_diff_vs_whole_utterance"] < 1e-5, (name, out[name])


def test_convrnn_sequence_memory_beats_chance():
    out = load("convrnn_sequence_memory").main(steps=150)
    losses = out["losses"]
    assert losses[-1] < losses[0] - 0.5, losses
    # The example's own bar: at least 4x chance (1/8) on sequences it never saw.
    assert out["accuracy"] >= 4 * out["chance"], out["accuracy"]


def test_convlstm_next_frame_beats_copy_last_frame():
    out = load("convlstm_next_frame").main(steps=100)
    losses = out["losses"]
    assert losses[-1] < losses[0] - 0.2, losses
    assert out["mse"] < out["copy_last_mse"], (out["mse"], out["copy_last_mse"])
