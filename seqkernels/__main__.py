"""`python -m seqkernels`: print this build's configuration (see seqkernels.show_config)."""
from ._config import show_config

show_config()
