#!/usr/bin/env bash
# Runs every libFuzzer target of test/fuzz for SECONDS each (default 60) under ASan and UBSan,
# two at a time per core pair, starting from the seeds in test/fuzz/corpus/<target>/. New inputs
# go to build-fuzz/corpus/<target>/, crashes to build-fuzz/crashes/<target>/; copy an input that
# once crashed into test/fuzz/corpus/<target>/ so CI replays it for ever. Prints one line per
# target (executions, coverage, crashes) and exits 1 if any target crashed or did not run; a
# step that fails (set-up, configure, build) is named with the end of its output.
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (targets: job_spec tf_config wire control_line
#                                              line_splitter safetensors idx npy image zip)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(job_spec tf_config wire control_line line_splitter safetensors idx npy image zip)
case "$seconds" in ''|*[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;; esac

# Runs a step quietly; when it fails, says which and shows the end of its output, then exits 1.
step() {
  local what=$1 log
  shift
  log=$(mktemp)
  if ! "$@" >"$log" 2>&1; then
    echo "fuzz.sh: failed: $what: $*" >&2
    tail -n 40 "$log" | sed 's/^/  /' >&2
    echo "fuzz.sh: (the last 40 lines of its output; the whole output is in $log)" >&2
    exit 1
  fi
  rm -f "$log"
}

need=()
command -v clang++-14 >/dev/null || need+=(clang-14)
[ -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a ] || need+=(libfuzzer-14-dev)
[ -e /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.asan-x86_64.a ] || need+=(libclang-common-14-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "# installing ${need[*]}" >&2
  step "installing the build's packages" bash scripts/setup.sh
  step "installing ${need[*]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

build=build-fuzz
step "configuring $build with clang 14" env CC=clang-14 CXX=clang++-14 \
  cmake -S . -B "$build" -G Ninja -DDTRAIN_WITH_CUDA=OFF -DDTRAIN_FUZZ=ON \
  -DDTRAIN_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS=
step "building ${targets[*]/#/fuzz_}" ninja -C "$build" "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
# UBSan findings stop the run (halt_on_error) unless test/fuzz/ubsan.supp names them (code
# that is not ours).
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/test/fuzz/ubsan.supp
run_one() {
  local t=$1
  mkdir -p "$build/corpus/$t" "$build/crashes/$t"
  "$build/test/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/crashes/$t/" \
    "$build/corpus/$t" "test/fuzz/corpus/$t" > "$build/fuzz-$t.log" 2>&1 || true
}
parallel=$(nproc)
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then wait -n; running=$((running - 1)); fi
done
wait

echo "# scripts/fuzz.sh $seconds s per target, ASan+UBSan, $(date -u +%F) ($(nproc) cores)"
printf '%-14s %12s %8s %8s %8s %8s\n' target executions exec_per_s cov features crashes
failed=0
for t in "${targets[@]}"; do
  log="$build/fuzz-$t.log"
  last() { grep -o "$1" "$log" | tail -n 1 | grep -o '[0-9]*$' || true; }
  runs=$(last 'stat::number_of_executed_units: *[0-9]*')
  rate=$(last 'stat::average_exec_per_sec: *[0-9]*')
  cov=$(last 'cov: [0-9]*')
  ft=$(last 'ft: [0-9]*')
  crashes=$(find "$build/crashes/$t" -type f | wc -l)
  printf '%-14s %12s %8s %8s %8s %8s\n' "$t" "${runs:-0}" "${rate:-0}" "${cov:-0}" "${ft:-0}" "$crashes"
  if [ "$crashes" -gt 0 ]; then
    failed=1
    find "$build/crashes/$t" -type f | sed 's/^/  crash: /'
    grep -m3 -E 'ERROR|runtime error|invariant broken|terminate' "$log" | sed 's/^/  /' || true
  elif [ -z "$runs" ]; then  # it did not run to its end: say why instead of a row of zeros
    failed=1
    echo "  $t: no final statistics; the end of $log:"
    tail -n 20 "$log" | sed 's/^/  /'
  fi
done
exit $failed
