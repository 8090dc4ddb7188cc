#!/usr/bin/env bash
# Builds attnx's wheel into dist/ (or the folder given): `pip wheel` compiles the extension linked
# to the OpenBLAS of the scipy-openblas32 wheel (CMakeLists.txt), then `auditwheel repair` checks
# the extension's symbol versions and tags the wheel manylinux_2_X. libscipy_openblas.so is left out
# of the repair: scipy-openblas32, a dependency of attnx, installs it beside attnx, as NumPy's and
# SciPy's wheels rely on it. Needs the build requirements installed (scripts/setup.sh does), so
# that the build reuses build/<wheel tag> instead of compiling everything in a new isolated env.
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-dist}")"
raw="$(mktemp -d)"
trap 'rm -rf "$raw"' EXIT
python3 -m pip wheel . --no-deps --no-build-isolation -q --disable-pip-version-check -w "$raw"
python3 -m auditwheel repair --exclude libscipy_openblas.so -w "$out" "$raw"/attnx-*.whl 2>&1 | grep -v "^INFO" || true
ls "$out"/attnx-*manylinux*.whl
