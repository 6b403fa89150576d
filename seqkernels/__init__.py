"""seqkernels: fast recurrent sequence kernels for PyTorch.

Importing the package loads the native extension ``seqkernels._C``, whose static
initialisers register the ``torch.ops.seqkernels.*`` operators. There is no pure-Python
fallback: if the extension cannot be loaded, the import fails with the reason.
"""
import torch  # noqa: F401  (loads libtorch before the extension that links against it)

try:
    from . import _C  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "seqkernels: the native extension seqkernels._C could not be loaded "
        f"({exc}). Build it with `pip install --no-build-isolation -e .` against the torch "
        f"you are running (torch {torch.__version__})."
    ) from exc

from .ops.lstm import lstm_layer  # noqa: E402
from .nn.lstm import LSTM, LSTMCell, replace_lstm  # noqa: E402
from .ops.convrnn import convrnn, convrnn_forward  # noqa: E402
from .nn.convrnn import ConvRNN  # noqa: E402
from .ops.convlstm import convlstm, release_step_graphs  # noqa: E402
from .nn.convlstm import ConvLSTM  # noqa: E402

__all__ = ["LSTM", "LSTMCell", "replace_lstm", "lstm_layer", "ConvRNN", "convrnn", "convrnn_forward", "ConvLSTM", "convlstm", "release_step_graphs", "show_config"]
__version__ = "0.1.0"

from ._config import show_config  # noqa: E402  (reads __version__)
