"""`python -m seqkernels`: print this build's configuration (see seqkernels.show_config).

With --batch and --hidden, also which LSTM time loop (persistent or BLAS/cuBLAS) the
`auto` heuristic picks for that shape on this machine, and why:

  python -m seqkernels --batch 16 --hidden 512
  python -m seqkernels --batch 64 --hidden 1024 --dtype bfloat16 --device cuda
  python -m seqkernels --batch 64 --hidden 1024 --dtype float16 --device cuda --ragged
"""
from __future__ import annotations

import argparse
import sys

import torch

from ._config import show_config, show_lstm_choice

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m seqkernels", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, metavar="B", help="batch size of the LSTM shape to explain")
    p.add_argument("--hidden", type=int, metavar="H", help="hidden size of the LSTM shape to explain")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="default float32")
    p.add_argument("--proj", type=int, default=0, metavar="P", help="proj_size (default 0: none)")
    p.add_argument("--steps", type=int, default=256, metavar="T", help="sequence length (default 256)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda if available, else cpu")
    p.add_argument("--ragged", action="store_true",
                   help="a PackedSequence whose batch sizes shrink (CUDA's choice differs; default: equal batch sizes)")
    args = p.parse_args(argv)
    if (args.batch is None) != (args.hidden is None):
        p.error("--batch and --hidden go together")
    if args.batch is not None and (args.batch < 1 or args.hidden < 1 or args.proj < 0 or args.steps < 1):
        p.error("--batch, --hidden and --steps must be >= 1, --proj >= 0")
    show_config()
    if args.batch is not None:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        print()
        try:
            show_lstm_choice(args.batch, args.hidden, _DTYPES[args.dtype], args.proj, device, args.steps, args.ragged)
        except ValueError as exc:  # e.g. a bad SEQKERNELS_LSTM_BACKEND
            print(f"python -m seqkernels: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
