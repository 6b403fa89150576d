"""Pure-PyTorch references (plain loops over time): the ground truth of the tests."""
from .convlstm import convlstm_module_reference, convlstm_reference
from .convrnn import convrnn_reference, convrnn_template_reference
from .lstm import lstm_cell_reference, lstm_layer_reference, lstm_reference

__all__ = [
    "convlstm_module_reference",
    "convlstm_reference",
    "convrnn_reference",
    "convrnn_template_reference",
    "lstm_cell_reference",
    "lstm_layer_reference",
    "lstm_reference",
]
