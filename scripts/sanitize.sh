#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run (gcc's runtime: libasan / libubsan).
#
#   bash scripts/sanitize.sh            # C++ unit tests + the fast Python subset (what CI runs)
#   bash scripts/sanitize.sh --all      # C++ unit tests + the whole pytest suite
#   bash scripts/sanitize.sh tests/test_fuzz.py -k dense   # C++ tests + the given pytest args
#   bash scripts/sanitize.sh --build-only   # only the build (scripts/test.sh starts it before the
#                                           # test extra is installed, then runs the rest)
#
# The sanitized extension is built in build/sanitize/ (CMake option ATTNX_SANITIZE) and never
# copied over python/attnx/_core*.so: pytest runs against a temporary copy of python/attnx/ that
# holds the sanitized .so, with libasan preloaded into the (uninstrumented) Python interpreter.
# Leak detection is off for Python (the interpreter and NumPy keep memory until exit by design)
# and on for the C++ tests; any UBSan report aborts the run (halt_on_error=1).
#
# The fast subset (SANITIZE_SUBSET below, by file) exercises every binding without PyTorch: the
# fuzz (with ATTNX_FUZZ_EXAMPLES=6 unless set), bad-input, NaN-guard, concurrency, mask-rule and
# hostile-input tests, and the kernel fuzzer (tests/test_fuzz_kernels.py: every binding's recorded
# calls with one argument mutated; ATTNX_FUZZ_KERNEL_MUTATIONS=20 unless set). libFuzzer would need
# clang, which the image does not have; the mutation loop runs on gcc's ASan + UBSan instead. The parity tests import torch; they run with --all, torch loading under the
# preloaded runtime too.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"

SANITIZE_SUBSET=(tests/test_bad_input.py tests/test_fuzz.py tests/test_nan_guard.py tests/test_concurrency.py
                 tests/test_masks_core.py tests/test_hostile_core.py tests/test_crafted_files.py
                 tests/test_fuzz_kernels.py)

pytest_args=()
build_only=""
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
elif [ "${1:-}" = "--all" ]; then
  shift
  # these two measure the release artifact (import time, size of _core), not what an instrumented
  # build (~50 MB, several times slower to load) can meet
  pytest_args=(tests --deselect tests/test_package.py::test_import_is_fast_and_light
               --deselect tests/test_package.py::test_extension_under_10_mb "$@")
elif [ $# -gt 0 ]; then
  pytest_args=("$@")
else
  for f in "${SANITIZE_SUBSET[@]}"; do [ -f "$f" ] && pytest_args+=("$f"); done
  # the CI subset runs the fuzz tests with a small budget (ASan makes every call slower)
  export ATTNX_FUZZ_EXAMPLES="${ATTNX_FUZZ_EXAMPLES:-6}"
  export ATTNX_FUZZ_KERNEL_MUTATIONS="${ATTNX_FUZZ_KERNEL_MUTATIONS:-20}"  # every binding, 20 mutations per seed
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

source scripts/build_env.sh  # ccache
dir=build/sanitize
mkdir -p build  # the logs sit beside the build folder, which a fresh clone lacks
# -O0 (from ATTNX_SANITIZE) and line tables only (-g1): enough for the reports' stack traces, and
# the build stays short for CI
jobs="${ATTNX_BUILD_JOBS:-$(nproc)}"
echo "== sanitizer build ($dir)"
cmake -S . -B "$dir" -DATTNX_SANITIZE=ON -DATTNX_BUILD_PYTHON=ON -DATTNX_BUILD_TESTS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-g1" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
  -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" -DPython_EXECUTABLE="$(command -v python3)" \
  > "$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j"$jobs" > "$dir.build.log" 2>&1 \
  || { grep -E -A3 "error" "$dir.build.log" | head -60; exit 1; }
[ -z "$build_only" ] || exit 0

# any report aborts the process (ASan always, UBSan by halt_on_error), which fails the step
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"

echo "== C++ unit tests under ASan+UBSan"
(cd "$dir" && ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1" \
  ctest --output-on-failure -j"$jobs")

echo "== pytest under ASan+UBSan: ${pytest_args[*]}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/attnx-sanitize.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/python"
cp -r python/attnx "$tmp/python/"
find "$tmp/python" -name "__pycache__" -prune -exec rm -rf {} +
rm -f "$tmp"/python/attnx/_core*.so
cp "$dir"/_core*.so "$tmp/python/attnx/"

export PYTHONPATH="$tmp/python"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1"
export PYTHONMALLOC=malloc          # every Python allocation goes through ASan's malloc
export MPLBACKEND=Agg
export ATTNX_DATA_DIR="${ATTNX_DATA_DIR:-$(cd .. && pwd)/shared/data}"
# make sure the sanitized extension is the one imported
LD_PRELOAD="$preload" python3 -c "import attnx._core as c, sys; \
  assert c.__file__.startswith('$tmp'), c.__file__; print('extension:', c.__file__)"
# --capture=sys: C-level stderr (the sanitizer report) reaches the log even when the process aborts
LD_PRELOAD="$preload" python3 -m pytest -q -ra -p no:cacheprovider --capture=sys "${pytest_args[@]}"
echo "sanitizers: no findings"
