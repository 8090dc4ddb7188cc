#!/usr/bin/env bash
# Sets up everything (system packages, attnx with its test extra) and runs the whole test suite:
# the C++ unit tests (ctest) and pytest (gradient checks, PyTorch parity, bad input, end-to-end
# training, notebooks). Exits non-zero unless tests ran and passed. Prints each phase's wall time
# and CPU time (user+sys of everything it ran) as it ends, and a table of them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

# CPU seconds of this shell's finished children (cutime + cstime of /proc/<pid>/stat, in clock ticks)
children_cpu() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($16 + $17) / hz}' "/proc/$$/stat"; }
phase_name=""; phase_table=""
phase() {  # phase NAME: ends the running phase (if any) and starts NAME; `phase ""` only ends
  local now cpu
  now="$(date +%s.%N)"; cpu="$(children_cpu)"
  if [ -n "$phase_name" ]; then
    local line
    line="$(awk -v n="$phase_name" -v w="$now - $phase_wall0" -v c="$cpu - $phase_cpu0" \
      'BEGIN {split(w, a, " - "); split(c, b, " - "); printf "%-10s %7.0f s wall %7.0f s CPU", n, a[1] - a[2], b[1] - b[2]}')"
    echo "-- $line"
    phase_table+="$line"$'\n'
  fi
  phase_name="$1"; phase_wall0="$now"; phase_cpu0="$cpu"
}
report() {
  local status=$?
  phase ""
  echo "== time per phase (CPU = user+sys of all processes; exit status $status)"
  printf "%s" "$phase_table"
}
trap report EXIT

phase setup
echo "== setup (system packages, pip install .[test])"
bash scripts/setup.sh test
shared_data="$(cd .. && pwd)/shared/data"
# one folder holding uci-sentiment/ and anki/ serves every loader: the shared data beside the
# clone when it is there (CI), else the caller's ATTNX_DATA_DIR
if [ -d "$shared_data/uci-sentiment" ] && [ -d "$shared_data/anki" ]; then
  export ATTNX_DATA_DIR="$shared_data"
fi
export MPLBACKEND=Agg
phase ctest
echo "== C++ unit tests"
cmake -S . -B build/ctest -DATTNX_BUILD_TESTS=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/ctest -j"$(nproc)" >/dev/null
(cd build/ctest && ctest --output-on-failure)
phase docs
echo "== docs (API reference from the docstrings; warnings are errors)"
python3 -m mkdocs build --strict -q
phase pytest
echo "== pytest"
# run from tests/ so that the installed attnx is what gets imported, not the source tree
(cd tests && python3 -m pytest -q -ra --durations=40 "$@")
phase sanitize
echo "== sanitizers (C++ unit tests + a fast Python subset under ASan+UBSan)"
bash scripts/sanitize.sh
