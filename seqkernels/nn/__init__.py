"""nn.Module wrappers over the seqkernels ops."""
from .lstm import LSTM, LSTMCell, replace_lstm

__all__ = ["LSTM", "LSTMCell", "replace_lstm"]
