"""nn.Module wrappers over the seqkernels ops."""
from .convrnn import ConvRNN
from .lstm import LSTM, LSTMCell, replace_lstm

__all__ = ["ConvRNN", "LSTM", "LSTMCell", "replace_lstm"]
