#!/usr/bin/env bash
# Sets up a fresh Debian/Ubuntu machine for attnx: system packages (a C++17 compiler, ccache,
# xtensor, xtensor-blas; OpenBLAS for the C++ unit tests, the module links scipy-openblas32's;
# Devanagari and CJK fonts for attnx.plot's labels), then attnx itself with the Python extras given
# (default: none).
#   bash scripts/setup.sh            # the package
#   bash scripts/setup.sh test       # + pytest, hypothesis, torch==2.13.0 (parity), matplotlib
#   bash scripts/setup.sh --build-requirements   # only what building attnx needs (system packages,
#                                    # pyproject.toml's build requirements): scripts/test.sh starts the
#                                    # sanitizer build then, beside the install
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
packages="g++ ccache libxtensor-dev libxtensor-blas-dev libopenblas-dev fonts-lohit-deva fonts-wqy-microhei"
missing=""
for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "installing system packages:$missing"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
source scripts/build_env.sh  # ccache
# the build requirements of pyproject.toml (and the cmake and ninja scikit-build-core would fetch
# into an isolated env), installed here rather than in a throwaway isolated env, so that later
# builds (scripts/build_wheel.sh, a reinstall) reuse build/<wheel tag>
python3 -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "pybind11>=2.12" \
  "scipy-openblas32>=0.3.27" "cmake>=3.18" ninja
[ "${1:-}" = "--build-requirements" ] && exit 0
extras="${1:-}"
target="."
[ -n "$extras" ] && target=".[$extras]"
echo "pip install $target"
python3 -m pip install -q --disable-pip-version-check --no-build-isolation "$target"
