"""Pure-PyTorch references (plain loops over time): the ground truth of the tests."""
from .convrnn import convrnn_reference, convrnn_template_reference
from .lstm import lstm_cell_reference, lstm_layer_reference, lstm_reference

__all__ = [
    "convrnn_reference",
    "convrnn_template_reference",
    "lstm_cell_reference",
    "lstm_layer_reference",
    "lstm_reference",
]
