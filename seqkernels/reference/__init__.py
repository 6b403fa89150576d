"""Pure-PyTorch references (plain loops over time): the ground truth of the tests."""
from .lstm import lstm_cell_reference, lstm_layer_reference, lstm_reference

__all__ = ["lstm_cell_reference", "lstm_layer_reference", "lstm_reference"]
