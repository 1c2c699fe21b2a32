#!/usr/bin/env bash
# All-reduce for N processes (started by `dtrain launch`), 4 KiB to MAX_BYTES, over the TCP ring,
# shared memory, or what communication "auto" picks, with the machine's bounds (memcpy,
# point-to-point TCP) measured in the same run. --transport may be given more than once: one
# table each, in one run. --mpi adds OpenMPI's MPI_Allreduce over its shared memory (btl vader)
# for comparison, installing Debian's libopenmpi-dev and openmpi-bin when they are missing.
# shm keeps the data in the communicator's window (summed straight from the peers' memory, as
# the trainer's gradients are); shm-copy keeps it in the caller's own memory (through the slots).
# --realtime runs every measured process under SCHED_RR (chrt -r 50; root), so that other work on
# a shared machine does not preempt them; all transports alike.
#   scripts/bench-allreduce.sh N [MAX_BYTES] [--transport tcp|shm|shm-copy|auto]... [--mpi]
#                              [--realtime]
set -euo pipefail
cd "$(dirname "$0")/.."
n=2
max=67108864
transports=()
mpi=0
prio=()
positional=0
while [ $# -gt 0 ]; do
  case "$1" in
    --transport) transports+=("$2"); shift 2 ;;
    --transport=*) transports+=("${1#--transport=}"); shift ;;
    --mpi) mpi=1; shift ;;
    --realtime) prio=(chrt -r 50); shift ;;
    *) if [ $positional -eq 0 ]; then n=$1; else max=$1; fi; positional=$((positional + 1)); shift ;;
  esac
done
[ ${#transports[@]} -gt 0 ] || transports=(tcp)
for t in "${transports[@]}"; do
  case "$t" in tcp|shm|shm-copy|auto) ;; *) echo "bench-allreduce: --transport $t: expected tcp, shm, shm-copy or auto" >&2; exit 2 ;; esac
done
build=${BUILD:-build}  # the build folder (BUILD=... to use another)
bash scripts/build.sh "$build" >/dev/null
work=$(mktemp -d /tmp/dtrain-bench-allreduce-XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "# scripts/bench-allreduce.sh $n ($(nproc) cores${prio[@]+, ${prio[*]}})"
for t in "${transports[@]}"; do
  cat > "$work/job-$t.json" <<JOB
{"job": "bench-allreduce", "workers": $n, "run_dir": "$work/run-$t",
 "command": ["$PWD/$build/bench/allreduce_bench", "$work/table-$t.txt", "$max", "$t"],
 "restart": {"max_restarts": 0}, "env": {"DTRAIN_LOG_LEVEL": "warn"}}
JOB
  ${prio[@]+"${prio[@]}"} ./$build/launcher/dtrain launch "$work/job-$t.json" > "$work/launch-$t.log" 2>&1 || { cat "$work/launch-$t.log"; exit 1; }
  cat "$work/table-$t.txt"
done
if [ $mpi -eq 1 ]; then
  if ! command -v mpirun >/dev/null 2>&1 || ! dpkg-query -W -f='${Status}' libopenmpi-dev 2>/dev/null | grep -q 'install ok installed'; then
    echo "# installing libopenmpi-dev and openmpi-bin for the comparison" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libopenmpi-dev openmpi-bin >/dev/null 2>&1 \
      || { echo "# openmpi: not installed (apt-get failed); no comparison"; exit 0; }
  fi
  cmake -S . -B "$build" >/dev/null
  cmake --build "$build" --target mpi_allreduce_bench >/dev/null
  [ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  ${prio[@]+"${prio[@]}"} timeout 600 mpirun -np "$n" --oversubscribe --mca btl self,vader "$build/bench/mpi_allreduce_bench" "$max"
fi
