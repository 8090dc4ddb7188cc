#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run (gcc's runtime: libasan / libubsan).
#
#   bash scripts/sanitize.sh            # C++ unit tests + the fast Python subset (what CI runs)
#   bash scripts/sanitize.sh --all      # C++ unit tests + the whole pytest suite
#   bash scripts/sanitize.sh tests/test_fuzz.py -k dense   # C++ tests + the given pytest args
#
# The sanitized extension is built in build/sanitize/ (CMake option ATTNX_SANITIZE) and never
# copied over python/attnx/_core*.so: pytest runs against a temporary copy of python/attnx/ that
# holds the sanitized .so, with libasan preloaded into the (uninstrumented) Python interpreter.
# Leak detection is off for Python (the interpreter and NumPy keep memory until exit by design)
# and on for the C++ tests; any UBSan report aborts the run (halt_on_error=1).
#
# The fast subset (SANITIZE_SUBSET below) is a list of test files that exercise every binding
# without PyTorch: the fuzz, bad-input, fault-injection, NaN-guard and concurrency tests plus the
# model tests. Parity tests import torch, whose own libraries are not built for ASan; they run
# with --all, where torch is imported under the preloaded runtime as well.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"

SANITIZE_SUBSET=(tests/test_bad_input.py tests/test_fuzz.py tests/test_faults.py tests/test_nan_guard.py
                 tests/test_concurrency.py tests/test_models.py tests/test_saving.py)

pytest_args=()
if [ "${1:-}" = "--all" ]; then
  shift
  pytest_args=(tests "$@")
elif [ $# -gt 0 ]; then
  pytest_args=("$@")
else
  for f in "${SANITIZE_SUBSET[@]}"; do [ -f "$f" ] && pytest_args+=("$f"); done
fi

libasan="$(gcc -print-file-name=libasan.so)"
libubsan="$(gcc -print-file-name=libubsan.so)"
if [ ! -e "$libasan" ] || [ ! -e "$libubsan" ]; then
  # gcc ships the sanitizer runtimes in libasan<N> / libubsan<N>; install the ones this gcc uses
  ver="$(gcc -dumpversion | cut -d. -f1)"
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing the sanitizer runtimes for gcc $ver"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "libgcc-$ver-dev" >/dev/null
  libasan="$(gcc -print-file-name=libasan.so)"
fi
libasan="$(readlink -f "$libasan")"
# libstdc++ must be loaded when libasan initialises, or its __cxa_throw interceptor finds no real
# function and the first C++ exception aborts ("real___cxa_throw != 0"): Python doesn't link it
preload="$libasan $(readlink -f "$(gcc -print-file-name=libstdc++.so)")"

dir=build/sanitize
jobs="${ATTNX_BUILD_JOBS:-$(nproc)}"
echo "== sanitizer build ($dir)"
cmake -S . -B "$dir" -DATTNX_SANITIZE=ON -DATTNX_BUILD_PYTHON=ON -DATTNX_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$(command -v python3)" \
  > "$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j"$jobs" > "$dir.build.log" 2>&1 \
  || { grep -E -A3 "error" "$dir.build.log" | head -60; exit 1; }

# reports also go to files (pytest captures stderr, and an abort would lose what it captured)
logs="$repo/$dir/logs"
rm -rf "$logs"; mkdir -p "$logs"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan"
show_reports() { for f in "$logs"/*; do [ -f "$f" ] && { echo "== sanitizer report $f"; cat "$f"; }; done; return 0; }
trap show_reports ERR

echo "== C++ unit tests under ASan+UBSan"
(cd "$dir" && ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:log_path=$logs/asan" \
  ctest --output-on-failure)

echo "== pytest under ASan+UBSan: ${pytest_args[*]}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/attnx-sanitize.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
trap 'show_reports' ERR
mkdir -p "$tmp/python"
cp -r python/attnx "$tmp/python/"
find "$tmp/python" -name "__pycache__" -prune -exec rm -rf {} +
rm -f "$tmp"/python/attnx/_core*.so
cp "$dir"/_core*.so "$tmp/python/attnx/"

export PYTHONPATH="$tmp/python"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$logs/asan"
export PYTHONMALLOC=malloc          # every Python allocation goes through ASan's malloc
export MPLBACKEND=Agg
export ATTNX_DATA_DIR="${ATTNX_DATA_DIR:-$(cd .. && pwd)/shared/data}"
# make sure the sanitized extension is the one imported
LD_PRELOAD="$preload" python3 -c "import attnx._core as c, sys; \
  assert c.__file__.startswith('$tmp'), c.__file__; print('extension:', c.__file__)"
LD_PRELOAD="$preload" python3 -m pytest -q -ra -p no:cacheprovider "${pytest_args[@]}"
if compgen -G "$logs/*" >/dev/null; then show_reports; echo "sanitizer reports found" >&2; exit 1; fi
echo "sanitizers: no findings"
