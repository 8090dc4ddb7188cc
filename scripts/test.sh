#!/usr/bin/env bash
# Sets up everything (system packages, attnx with its test extra) and runs the whole test suite:
# the C++ unit tests (ctest) and pytest (gradient checks, PyTorch parity, bad input, end-to-end
# training, notebooks). Exits non-zero unless tests ran and passed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
shared_data="$(cd .. && pwd)/shared/data"
# one folder holding uci-sentiment/ and anki/ serves every loader: the shared data beside the
# clone when it is there (CI), else the caller's ATTNX_DATA_DIR
if [ -d "$shared_data/uci-sentiment" ] && [ -d "$shared_data/anki" ]; then
  export ATTNX_DATA_DIR="$shared_data"
fi
export MPLBACKEND=Agg
echo "== C++ unit tests"
cmake -S . -B build/ctest -DATTNX_BUILD_TESTS=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/ctest -j"$(nproc)" >/dev/null
(cd build/ctest && ctest --output-on-failure)
echo "== docs (API reference from the docstrings; warnings are errors)"
python3 -m mkdocs build --strict -q
echo "== pytest"
# run from tests/ so that the installed attnx is what gets imported, not the source tree
(cd tests && python3 -m pytest -q -ra "$@")
echo "== sanitizers (C++ unit tests + a fast Python subset under ASan+UBSan)"
bash scripts/sanitize.sh
