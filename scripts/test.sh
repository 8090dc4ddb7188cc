#!/usr/bin/env bash
# Sets up everything (system packages, attnx with its test extra) and runs the whole test suite:
# the C++ unit tests (ctest) and pytest (gradient checks, PyTorch parity, bad input, end-to-end
# training, notebooks). Exits non-zero unless tests ran and passed. Prints each phase's wall time
# and CPU time (user+sys of everything it ran) as it ends, and a table of them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

# CPU seconds of this shell's finished children (cutime + cstime of /proc/<pid>/stat, in clock ticks)
# plus the sanitizer job's CPU once it has ended (it is not this shell's child: see below)
job_cpu=0
children_cpu() { awk -v hz="$(getconf CLK_TCK)" -v job="$job_cpu" '{printf "%.1f", ($16 + $17) / hz + job}' "/proc/$$/stat"; }
phase_name=""; phase_table=""; start_wall="$(date +%s.%N)"
phase() {  # phase NAME: ends the running phase (if any) and starts NAME; `phase ""` only ends
  local wall cpu line
  wall="$(date +%s.%N)"; cpu="$(children_cpu)"
  if [ -n "$phase_name" ]; then
    line="$(awk -v n="$phase_name" -v w0="$phase_wall" -v w1="$wall" -v c0="$phase_cpu" -v c1="$cpu" \
      'BEGIN {printf "%-9s %6.0f s wall %6.0f s CPU", n, w1 - w0, c1 - c0}')"
    echo "-- $line"
    phase_table+="$line"$'\n'
  fi
  phase_name="$1"; phase_wall="$wall"; phase_cpu="$cpu"
}
background=""  # the process group of the sanitizer job while it runs beside the other phases
finish() {
  local status=$1
  [ -z "$background" ] || kill -- "-$background" 2>/dev/null || true
  phase ""
  echo "== time per phase (CPU: user+sys of every process the phase ran, the background sanitizer job in sanitize; exit status $status)"
  printf "%s" "$phase_table"
  awk -v w0="$start_wall" -v w1="$(date +%s.%N)" -v c="$(children_cpu)" \
    'BEGIN {printf "%-9s %6.0f s wall %6.0f s CPU\n", "total", w1 - w0, c}'
}
trap 'finish $?' EXIT

phase setup
echo "== setup (system packages, pip install .[test]; the sanitizer build starts beside the install)"
bash scripts/setup.sh --build-requirements
source scripts/build_env.sh  # ccache (setup.sh installed it)
shared_data="$(cd .. && pwd)/shared/data"
# one folder holding uci-sentiment/ and anki/ serves every loader: the shared data beside the
# clone when it is there (CI), else the caller's ATTNX_DATA_DIR
if [ -d "$shared_data/uci-sentiment" ] && [ -d "$shared_data/anki" ]; then
  export ATTNX_DATA_DIR="$shared_data"
fi
export MPLBACKEND=Agg
# The sanitizer job (scripts/sanitize.sh: the ASan+UBSan build, then the C++ tests and a pytest
# subset under it) runs beside the other phases, at low priority in its own process group. Its build
# holds the longest single compile (the sanitized _core, one unit), so it starts first, as soon as
# the build requirements are there; its pytest subset waits for the test extra (build/setup.done).
# Its output is printed when the sanitize phase has waited for it.
# `setsid --fork`: the job is not this shell's child, so its CPU never lands in the phase that runs
# when it ends (bash reaps a finished background child at once, adding its CPU to this shell's
# children's); the sanitize phase adds it, from the job's own `time` line, when it has ended.
mkdir -p build
rm -f build/setup.done build/sanitize-job.pgid build/sanitize-job.status
sanitize_log=build/sanitize-job.log
setsid --fork nice -n 5 bash -c 'echo $$ > build/sanitize-job.pgid; status=0
  TIMEFORMAT="-- sanitizer job: %0R s wall %0U s user %0S s sys"
  time { bash scripts/sanitize.sh --build-only &&
         { until [ -e build/setup.done ]; do sleep 1; done; bash scripts/sanitize.sh; }; } || status=$?
  echo "$status" > build/sanitize-job.status' > "$sanitize_log" 2>&1
until [ -s build/sanitize-job.pgid ]; do sleep 0.1; done
background="$(cat build/sanitize-job.pgid)"
# The test install keeps pybind11's LTO, as wheels for users do: from a fresh clone, setup (mostly the
# build) cost 264 s of CPU with it and 412 s without (each binding file compiles the same inline
# kernels and pybind11 code again; LTO generates code once, in parallel, after merging them)
bash scripts/setup.sh test
touch build/setup.done
phase ctest
echo "== C++ unit tests"
cmake -S . -B build/ctest -DATTNX_BUILD_TESTS=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/ctest -j"$(nproc)" >/dev/null
(cd build/ctest && ctest --output-on-failure -j"$(nproc)")
phase docs
echo "== docs (API reference from the docstrings; warnings are errors)"
python3 -m mkdocs build --strict -q
phase pytest
echo "== pytest"
# run from tests/ so that the installed attnx is what gets imported, not the source tree
(cd tests && python3 -m pytest -q -ra --durations=40 "$@")
phase sanitize
echo "== sanitizers (C++ unit tests + a fast Python subset under ASan+UBSan; started during setup)"
until [ -e build/sanitize-job.status ] || ! kill -0 -- "-$background" 2>/dev/null; do sleep 1; done
status="$(cat build/sanitize-job.status 2>/dev/null || echo 1)"
background=""
cat "$sanitize_log"
job_cpu="$(awk '/^-- sanitizer job:/ {print $7 + $10}' "$sanitize_log")"
exit "$status"
