"""Builds seqkernels._C with torch's cpp_extension.

Environment:
  SEQKERNELS_CUDA=auto|0|1   build the CUDA sources (auto: when a CUDA toolkit and a CUDA
                             build of torch are both present; 1: required, error otherwise)
  DEBUG=1                    -O0 -g instead of optimised code
  TORCH_CUDA_ARCH_LIST       honoured by torch's cpp_extension (e.g. "9.0")
  MAX_JOBS                   parallel ninja jobs
Build without isolation so that pip never downloads torch:
  pip install --no-build-isolation -e .
"""
import glob
import os
import platform
import re
import sys

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError as exc:  # pragma: no cover - build-time guidance only
    raise SystemExit(
        "seqkernels needs torch installed before it is built (pip install torch), and must be "
        "built with `pip install --no-build-isolation -e .` so pip does not fetch another torch."
    ) from exc

ROOT = os.path.dirname(os.path.abspath(__file__))
# The version lives in one place: seqkernels/__init__.py.
with open(os.path.join(ROOT, "seqkernels", "__init__.py"), encoding="utf-8") as _init:
    VERSION = re.search(r'^__version__ = "([^"]+)"', _init.read(), re.M).group(1)


def want_cuda() -> bool:
    mode = os.environ.get("SEQKERNELS_CUDA", "auto").lower()
    available = torch.version.cuda is not None and CUDA_HOME is not None
    if mode in ("0", "off", "false", "no"):
        return False
    if mode in ("1", "on", "true", "yes"):
        if not available:
            raise SystemExit(
                f"SEQKERNELS_CUDA=1 but CUDA cannot be built: torch.version.cuda={torch.version.cuda}, "
                f"CUDA_HOME={CUDA_HOME}"
            )
        return True
    if mode != "auto":
        raise SystemExit(f"SEQKERNELS_CUDA must be auto, 0 or 1, got {mode!r}")
    return available


def extension():
    debug = os.environ.get("DEBUG", "0") == "1"
    use_cuda = want_cuda()
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # -fno-trapping-math (as torch itself is built) lets GCC if-convert, and so vectorise,
    # the branch-free gate math of the CPU kernels.
    cxx = opt + ["-fvisibility=hidden", "-fno-trapping-math", "-fno-math-errno"]
    link = []
    if sys.platform.startswith("linux"):
        # at::parallel_for is a header template: its `#pragma omp parallel` is compiled into
        # this extension, so without -fopenmp every parallel_for here runs on one thread.
        # The soname matches torch's bundled libgomp.so.1, so one OpenMP runtime is loaded.
        cxx += ["-fopenmp"]
        link += ["-fopenmp"]
    if platform.machine() in ("x86_64", "AMD64"):
        # The CPU gate kernels are written to auto-vectorise; x86-64-v3 (AVX2 + FMA, every
        # x86 server since ~2015) is the baseline. The extension checks it at load time.
        cxx += ["-mavx2", "-mfma", "-mf16c"]
        # The AVX-512 kernels (csrc/cpu/lstm_persistent.h) are compiled per function
        # (target attribute) and picked at run time; GCC's note that __m512 values change the
        # calling convention of functions built without AVX-512 concerns no call made here.
        cxx += ["-Wno-psabi"]
    define_macros = []
    kwargs = dict(
        name="seqkernels._C",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "csrc", "include")],
        define_macros=define_macros,
        extra_link_args=link,
    )
    if use_cuda:
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        define_macros.append(("SEQKERNELS_WITH_CUDA", "1"))
        nvcc = opt + ["-lineinfo", "--expt-relaxed-constexpr"]
        if debug:
            nvcc += ["-G"]
        return CUDAExtension(extra_compile_args={"cxx": cxx, "nvcc": nvcc}, libraries=["cublas", "cublasLt"], **kwargs)
    return CppExtension(extra_compile_args={"cxx": cxx}, **kwargs)


def write_build_config(use_cuda: bool) -> None:
    """seqkernels/_build_config.py: what this build of _C contains, for show_config()."""
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "") if use_cuda else ""
    with open(os.path.join(ROOT, "seqkernels", "_build_config.py"), "w") as f:
        f.write("# Written by setup.py at build time; not tracked.\n")
        f.write(f"CUDA = {use_cuda!r}\n")
        f.write(f"CUDA_ARCH_LIST = {arch!r}  # empty: torch's default (the GPUs visible at build time)\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"TORCH_CUDA_VERSION = {torch.version.cuda!r}\n")
        f.write(f"DEBUG = {os.environ.get('DEBUG', '0') == '1'!r}\n")


EXTENSION = extension()
write_build_config(use_cuda=any(src.endswith(".cu") for src in EXTENSION.sources))

setup(
    name="seqkernels",
    version=VERSION,
    description="Fast recurrent sequence kernels (LSTM, ConvRNN, ConvLSTM) for PyTorch",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    packages=find_packages(include=["seqkernels", "seqkernels.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.11"],
    # pip install 'seqkernels[plot]': the benchmarks' --plot (benchmarks/harness.py).
    extras_require={"plot": ["matplotlib"]},
    ext_modules=[EXTENSION],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
