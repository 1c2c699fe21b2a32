#!/usr/bin/env bash
# Sets up, checks the format, builds and runs the whole test suite; this is what CI runs (.ci/run).
# Two builds, both with warnings as errors in dtrain's own code (-DDTRAIN_WERROR=ON): the default
# one (CUDA backend compiled when the toolkit is found; GPU tests say "no GPU" and skip without
# one) and the CPU-only one (-DDTRAIN_WITH_CUDA=OFF). The CPU-only build has and runs every test;
# the default one only the suites of code that differs with CUDA (worker, collectives, data,
# layers, training, GPU): common, CLI, logs and launcher code, test beds included, is compiled the
# same in both (CI's time: on 2 cores the two builds and both runs of every suite would take over
# 20 minutes). "-LE launcher_beds" keeps the launcher's test beds out of any build that has them.
# Every test is labelled unit, slow or bed, with a time-out to match (docs/testing.md#labels); at
# the end, pass or fail, each ctest run's tests are listed by time, longest first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tests
jobs=$(nproc)
# setup.sh installed everything the test beds need (network namespaces with sshd, a Slurm cluster
# with munge, PyTorch): a test bed that cannot start fails its tests here instead of skipping.
# GPU tests still skip on a machine without a GPU.
export DTRAIN_REQUIRE_TESTBEDS=1

# run_ctest NAME BUILD_DIR [ctest args...]: ctest in BUILD_DIR, its LastTest.log kept as NAME's
# (the next run in the same directory writes its own) for the table print_times makes at exit.
runs=()
run_ctest() {
  local name=$1 dir=$2 status=0
  shift 2
  ctest --test-dir "$dir" "$@" || status=$?
  local log="$dir/Testing/Temporary/LastTest.log"
  if [ -f "$log" ]; then
    cp "$log" "$dir/Testing/Temporary/LastTest-$name.log"
    runs+=("$name=$dir/Testing/Temporary/LastTest-$name.log")
  fi
  return "$status"
}
print_times() {
  local run
  for run in "${runs[@]+"${runs[@]}"}"; do
    echo "== seconds per test, ${run%%=*}, longest first =="
    awk '/^[0-9]+\/[0-9]+ Test: /{name=$3} /^Test time =/{printf "%8.1f  %s\n", $4, name}' \
      "${run#*=}" | sort -rn
  done
}
trap print_times EXIT

echo "== format check (scripts/format.sh --check) =="
bash scripts/format.sh --check

echo "== default build (build/) =="
bash scripts/build.sh build -DDTRAIN_WERROR=ON
run_ctest default build --output-on-failure --timeout 600 -j "$jobs" -LE launcher_beds

echo "== CPU-only build (build-cpu/) =="
bash scripts/build.sh build-cpu -DDTRAIN_WITH_CUDA=OFF -DDTRAIN_WERROR=ON
# The fuzz build (scripts/fuzz.sh) is clang's: its files that part from gcc's, compiled by clang.
echo "== clang 14 compile check (scripts/clang-check.sh build-cpu) =="
bash scripts/clang-check.sh build-cpu
run_ctest cpu-only build-cpu --output-on-failure --timeout 600 -j "$jobs"

# The suites that compute with oneDNN (its kernels, dtrain's own vector kernels, and the
# bit-exactness of resume, recovery in place and elastic membership) once more as on a CPU
# without AVX-512: oneDNN and dtrain's own dispatch both obey the cap (docs/testing.md#a-smaller-cpu),
# so a break that only an AVX2 machine would show shows here on any x86-64 machine.
echo "== CPU-only build's oneDNN suites under ONEDNN_MAX_CPU_ISA=AVX2 =="
ONEDNN_MAX_CPU_ISA=AVX2 run_ctest cpu-only-avx2 build-cpu --output-on-failure --timeout 600 \
  -j "$jobs" -R '^(test_nn|test_train|test_worker)$'
