#!/usr/bin/env bash
# Developer build: compiles attnx._core into python/attnx/ so that `PYTHONPATH=python pytest`
# tests this checkout without installing it. Options: --debug, --native; --sanitize runs
# scripts/sanitize.sh (ASan+UBSan build in build/sanitize/ and the tests under it) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
build_type=Release; extra=()
for arg in "$@"; do
  case "$arg" in
    --debug) build_type=Debug ;;
    # a sanitized _core only loads with libasan preloaded: it must not replace python/attnx/_core*.so
    # that everyone's plain `python` imports. scripts/sanitize.sh builds it aside and runs the tests.
    --sanitize) exec bash scripts/sanitize.sh ;;
    --native) extra+=(-DATTNX_NATIVE=ON) ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done
dir=build/dev-${build_type}${extra:+-custom}
mkdir -p build  # the logs sit beside the build folder, which a fresh clone lacks
source scripts/build_env.sh  # ccache when installed
# no link-time optimization: a developer rebuilds often, and the LTO link alone takes minutes here
cmake -S . -B "$dir" -DATTNX_BUILD_PYTHON=ON -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -Dpybind11_DIR="$(python3 -m pybind11 --cmakedir)" \
  -DPython_EXECUTABLE="$(command -v python3)" "${extra[@]}" > "$dir.configure.log" 2>&1 \
  || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j"$(nproc)" > "$dir.build.log" 2>&1 \
  || { grep -E -A3 "error" "$dir.build.log" | head -60; exit 1; }
# copy then rename: a process that has the old module loaded keeps its (unlinked) file intact
for so in "$dir"/_core*.so; do
  cp "$so" "python/attnx/.$(basename "$so").tmp" && mv -f "python/attnx/.$(basename "$so").tmp" "python/attnx/$(basename "$so")"
done
echo "built $(ls python/attnx/_core*.so)"
