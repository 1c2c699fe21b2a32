#!/usr/bin/env bash
# Builds dtrain CPU-only with sanitizers and runs its tests (issue 14); prints one line per suite
# and a summary per sanitizer, and exits 1 if any suite failed.
#   scripts/test-sanitizers.sh [address|thread|all]      (default all)
# - address: ASan + UBSan (build-asan/), every CTest suite. No suite is excluded; the one check
#   that cannot work under ASan (test_train's `ulimit -v` run, ASan reserves terabytes of address
#   space) says "skipped under sanitizers" in its output (test/train/test_trainer.cc).
# - thread: TSan (build-tsan/), the suites whose code under test runs threads of dtrain's own:
#   the communicators (ring algorithms over threads, the acceptor's handshake threads, the
#   async all-reduce thread, shared-memory rings, the notice's interrupts from another thread), the
#   batcher's producer thread (test_data), the worker's signal thread (test_train, test_worker:
#   SIGTERM, SIGUSR1) and data-parallel training with ranks as threads (test_train), and the
#   launcher's and agent's process handling (test_launcher, test_agent). The other suites test
#   single-threaded code (parsers, the one-thread launcher loop, the reference backend) or
#   start the same programs that test_train and test_agent already start; ASan runs them all.
#   OpenMP threads inside oneDNN are not instrumented: test/tsan.supp silences those frames only.
# Children (dtrain, dtrain-worker, test programs) inherit the *SAN_OPTIONS below, so a finding in
# any process fails the test that started it.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
case "$mode" in
  address | thread | all) ;;
  *) echo "usage: scripts/test-sanitizers.sh [address|thread|all]" >&2; exit 2 ;;
esac
jobs=$(nproc)
tsan_suites=(test_comm test_tcp_ring test_shm test_hostile_peers test_interrupt test_data
             test_train test_worker test_launcher test_agent)

# Configures and builds DIR with sanitizers LIST; further arguments are the targets (none: all).
# A failed step is named, with the configure step's output (quiet when it succeeds), and kept for
# the summary; the caller then skips that sanitizer's tests.
build() {
  local dir=$1 list=$2 log
  shift 2
  log=$(mktemp)
  if ! cmake -S . -B "$dir" -G Ninja -DDTRAIN_WITH_CUDA=OFF -DDTRAIN_SANITIZE="$list" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "test-sanitizers.sh: failed: configuring $dir (-DDTRAIN_SANITIZE=$list), output above" >&2
    results+=("$list: configuring $dir failed")
    return 1
  fi
  rm -f "$log"
  if ! ninja -C "$dir" -j "$jobs" "$@"; then
    echo "test-sanitizers.sh: failed: building $dir (-DDTRAIN_SANITIZE=$list), output above" >&2
    results+=("$list: building $dir failed (ninja -C $dir $*)")
    return 1
  fi
}

# Runs ctest in DIR with the remaining arguments; keeps the per-suite result lines for the summary.
results=()
run_ctest() {
  local name=$1 dir=$2 start=$SECONDS status=0
  shift 2
  ctest --test-dir "$dir" --output-on-failure --timeout 1800 -j "$jobs" "$@" \
    2>&1 | tee "$dir/sanitizer-ctest.log" || status=$?
  local lines passed failed
  lines=$(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$dir/sanitizer-ctest.log" |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: /  /' | sort || true)
  passed=$(grep -c ' Passed ' <<<"$lines" || true)
  failed=$(grep -vc -e ' Passed ' -e '^$' <<<"$lines" || true)
  [ "$status" -eq 0 ] || [ "$failed" -gt 0 ] || failed=1  # ctest itself failed
  results+=("$name: $passed passed, $failed failed ($((SECONDS - start)) s)"$'\n'"$lines")
  [ "$failed" -eq 0 ]
}

status=0
if [ "$mode" != thread ]; then
  echo "== ASan + UBSan (build-asan/) =="
  if build build-asan address,undefined; then
    # detect_leaks: leaks fail the process at exit. detect_stack_use_after_return: the
    # communicators hand stack buffers to other threads. check_initialization_order and
    # strict_init_order: globals.
    export ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1
    # UBSan reports are recoverable (gcc's default), so the suppressions for code that is not ours
    # work; halt_on_error turns every other report into a failed process.
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/test/fuzz/ubsan.supp
    run_ctest address build-asan || status=1
  else
    status=1
  fi
fi
if [ "$mode" != address ]; then
  echo "== TSan (build-tsan/): ${tsan_suites[*]} =="
  if build build-tsan thread "${tsan_suites[@]}"; then
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/test/tsan.supp
    regex="^($(IFS='|'; echo "${tsan_suites[*]}"))\$"
    run_ctest thread build-tsan -R "$regex" || status=1
  else
    status=1
  fi
fi

echo
echo "== summary =="
for r in "${results[@]}"; do echo "$r"; done
exit $status
