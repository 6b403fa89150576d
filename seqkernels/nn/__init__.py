"""nn.Module wrappers over the seqkernels ops."""
from .convlstm import ConvLSTM
from .convrnn import ConvRNN
from .lstm import LSTM, LSTMCell, replace_lstm

__all__ = ["ConvLSTM", "ConvRNN", "LSTM", "LSTMCell", "replace_lstm"]
