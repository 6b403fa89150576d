#!/usr/bin/env bash
# Packaging check (issue 7): `python -m build` makes an sdist and, from it, a wheel; the wheel
# installs into a fresh virtual environment (no system site-packages) and passes the test
# suite there, importing seqkernels from the wheel, not from this checkout.
#
#   bash scripts/check_package.sh            # work dir: a new temp dir (printed)
#
# Needs network access or a local wheel cache for torch (the same torch pin as
# scripts/test.sh: SEQKERNELS_TORCH_VERSION, default 2.13.0, +cpu without an NVIDIA GPU).
# Takes a few minutes on 2 cores (the wheel compiles the extension).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
echo "check_package: work dir $WORK"
TORCH_PIN="torch==${SEQKERNELS_TORCH_VERSION:-2.13.0}"
command -v nvidia-smi >/dev/null 2>&1 || TORCH_PIN="${TORCH_PIN}+cpu"

"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q --disable-pip-version-check --upgrade pip "setuptools>=70.1" wheel build
"$VPY" -m pip install -q --disable-pip-version-check "$TORCH_PIN" ninja pytest hypothesis numpy matplotlib

# sdist, then the wheel built from the unpacked sdist (python -m build's default order);
# no isolation, so the build compiles against the venv's torch.
(cd "$ROOT" && "$VPY" -m build --no-isolation --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1) || {
  tail -30 "$WORK/build.log"
  exit 1
}
ls -l "$WORK/dist"
"$VPY" -m pip install -q --disable-pip-version-check --no-deps "$WORK"/dist/seqkernels-*.whl

# The tests, examples and benchmark scripts, outside the checkout: seqkernels must come
# from the installed wheel.
mkdir -p "$WORK/suite"
cp -r tests examples benchmarks "$WORK/suite/"
cd "$WORK/suite"
"$VPY" -c 'import seqkernels, sys; print("check_package: seqkernels", seqkernels.__version__, "from", seqkernels.__file__)'
"$VPY" -c 'import seqkernels, sys; sys.exit("check_package: imported from the checkout" if "/venv/" not in seqkernels.__file__ else 0)'
CI=${CI:-true} HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} "$WORK/venv/bin/pytest" -q -p no:cacheprovider tests
echo "check_package: wheel from sdist installs and passes the suite in a fresh venv ($WORK)"
