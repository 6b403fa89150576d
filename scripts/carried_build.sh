#!/usr/bin/env bash
# A GPU machine's build of seqkernels._C carried to a later device call. Each call starts on a bare
# machine, and a build there takes 110-170 s of a session's 1800 s of device time.
#
#   bash scripts/carried_build.sh save DIR [LOG]  # after a build (on the GPU machine): into DIR the
#                                            # stripped _C in parts of 15 MB (a call returns files of
#                                            # at most 16 MiB), _build_config.py, the build's key, and
#                                            # the build log LOG's ptxas lines (ptxas.txt)
#   bash scripts/carried_build.sh load DIR   # instead of a build: _C and _build_config.py from DIR
#                                            # into seqkernels/ if DIR's key is this tree's (exit 0;
#                                            # else exit 1, nothing written)
#   bash scripts/carried_build.sh key        # the key: csrc/ and setup.py's hash, the build
#                                            # settings, torch's and CUDA's versions
#
# The GPU machines set TORCH_CUDA_ARCH_LIST=9.0a in their environment (seen 2026-11-29), so a build
# there is for sm_90a and its key says so unless the variable is set for both the build and the key
# (gpu_check.sh uses the environment's value for both). A key computed here for that machine needs
# the same value: TORCH_CUDA_ARCH_LIST=9.0a (or the 9.0 the build used), and PYTHON pointing at a
# script that prints that machine's "torch.__version__ torch.version.cuda" ("2.11.0+cu130 13.0").
#
# Between calls, here: copy the parts a call returned into .sobuild/ (ignored) and name .sobuild
# in the next call's carry. scripts/gpu_check.sh loads it (GPU_CHECK_CARRIED, default .sobuild) in
# place of its build step, and with GPU_CHECK_SAVE_BUILD=1 saves its build into $OUT/carried
# (five of the eight files a call returns at sm_90: skip steps to make room). A loaded build imports from
# the repository root (gpu_check.sh puts it on PYTHONPATH); it is not installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"

key() {
  { find csrc setup.py -type f | LC_ALL=C sort | xargs sha256sum
    echo "${TORCH_CUDA_ARCH_LIST:-9.0} ${NVCC_APPEND_FLAGS:-} ${DEBUG:-}"
    "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)'; } | sha256sum | cut -c1-64
}

extension() {  # the path setup.py's in-place build writes _C to
  "$PY" -c 'import sysconfig; print("seqkernels/_C" + sysconfig.get_config_var("EXT_SUFFIX"))'
}

case "${1:-}" in
  key)
    key
    ;;
  save)
    dir="${2:?usage: carried_build.sh save DIR [LOG]}"
    lib="$(extension)"
    [ -f "$lib" ] || { echo "carried_build: no $lib to save" >&2; exit 1; }
    mkdir -p "$dir"
    rm -f "$dir"/_C.part_* "$dir/key"
    strip -S -o "$dir/_C.stripped" "$lib"  # the debug sections: 56 MB -> 40 MB for sm_90
    split -b 15M "$dir/_C.stripped" "$dir/_C.part_"
    rm "$dir/_C.stripped"
    cp seqkernels/_build_config.py "$dir/"
    if [ -n "${3:-}" ]; then grep -E "ptxas info|Compiling entry function" "$3" >"$dir/ptxas.txt" || true; fi
    key >"$dir/key"
    ;;
  load)
    dir="${2:?usage: carried_build.sh load DIR}"
    if [ ! -f "$dir/key" ] || ! compgen -G "$dir/_C.part_*" >/dev/null; then
      echo "carried_build: no carried build in $dir" >&2
      exit 1
    fi
    if [ "$(cat "$dir/key")" != "$(key)" ]; then
      echo "carried_build: $dir was built from other sources, settings or torch" >&2
      exit 1
    fi
    cat "$dir"/_C.part_* >"$(extension)"
    cp "$dir/_build_config.py" seqkernels/
    ;;
  *)
    echo "usage: scripts/carried_build.sh key | save DIR [LOG] | load DIR" >&2
    exit 2
    ;;
esac
