#!/usr/bin/env bash
# Writes the files a build needs of commit REV into DIR (untracked, not ignored: a device call
# carries it with the working tree), for scripts/ab_builds.sh.
#   scripts/ab_tree.sh HEAD ab_old
set -euo pipefail
[ "$#" -eq 2 ] || { echo "usage: scripts/ab_tree.sh REV DIR" >&2; exit 2; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rm -rf "$2"
mkdir -p "$2"
# setup.py reads README.md and seqkernels/__init__.py; the extension's sources are csrc/.
git -C "$ROOT" archive "$1" setup.py pyproject.toml README.md seqkernels csrc | tar -x -C "$2"
echo "ab_tree: $(git -C "$ROOT" rev-parse --short "$1") in $2"
