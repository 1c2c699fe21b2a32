#!/usr/bin/env bash
# Training-step speed of the tutorial CNN (configs/fashion-mnist-2workers.json's model) on the
# CPU: dtrain on oneDNN in float32 and in mixed_bfloat16 beside PyTorch's CPU build (Debian's
# python3-torch) in float32 and under torch.autocast("cpu", dtype=torch.bfloat16), batch 64 and
# 256, 1 and 2 threads, all in one run, as samples/s, with the ratios dtrain/PyTorch (both against
# PyTorch float32) and oneDNN's sgemm peak. "n/a" where the CPU cannot run dtrain's bf16
# (oneDNN's bf16 needs AVX512_BF16 or AMX), in PyTorch's bf16 column too. The header names the CPU model, oneDNN's ISA, the
# lscpu flags that matter (avx512_bf16, amx_bf16, avx512f, avx2), and PyTorch's version and the
# BLAS it loaded. PyTorch runs at its best (scripts/torch-at-best.sh: OpenBLAS's OpenMP build,
# glibc malloc tunables that keep freed blocks, and OpenBLAS's SkylakeX kernels where they are
# faster); the header says which kernels.
#   scripts/bench-step.sh [STEPS] [BUILD_DIR] [--repeat N] [--job FILE] [--profile | --profile-only]
# --job FILE times that job's model instead (e.g. configs/resnet-fashion-mnist.json, a graph with
# batch normalization): PyTorch builds the same graph (bench/step_torch.py --job, with the job's
# momentum and nesterov) and runs in its faster layout, NCHW or channels_last, named in the
# round lines.
# STEPS (default 50) timed steps after 10 warm-up; BUILD_DIR (default build) holds
# bench/step_bench. --profile adds, after the table, step_bench --profile's per-phase table of
# one step (data staging, each layer's forward and backward, loss, optimizer, all-reduce wait,
# other) at batch 64 and 256, 2 threads, float32 and mixed_bfloat16 (when the CPU has it);
# --profile-only prints those tables alone.
# --repeat N (default 3) runs each cell N times, the columns alternated, and prints medians. The
# paired_* columns are the median over the N rounds of each round's own ratio (dtrain against the
# PyTorch fp32 run beside it): steadier than the ratio of medians on a machine whose speed drifts
# between rounds, since both runs of a pair see the same phase. Each round's figures are printed
# as a '#' line under its cell.
set -euo pipefail
cd "$(dirname "$0")/.."
positional=() profile=table repeat=3 job=configs/fashion-mnist-2workers.json torch_job=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=also ;;
    --profile-only) profile=only ;;
    --repeat) repeat=$2; shift ;;
    --job) job=$2; torch_job=(--job "$2"); shift ;;
    -*) echo "usage: scripts/bench-step.sh [STEPS] [BUILD_DIR] [--repeat N] [--job FILE] [--profile | --profile-only]" >&2; exit 2 ;;
    *) positional+=("$1") ;;
  esac
  shift
done
steps=${positional[0]:-50}
build=${positional[1]:-build}
[ -f "$job" ] || { echo "bench-step: no job file $job" >&2; exit 2; }
bash scripts/build.sh "$build" >/dev/null
step_bench=$build/bench/step_bench

profile_tables() {
  echo "# step_bench --profile: $steps timed steps after 10 warm-up, 2 threads"
  local precisions=(float32)
  if [ "$("$step_bench" --cpu-info | sed -n 's/^mixed_bfloat16 //p')" = supported ]; then
    precisions+=(mixed_bfloat16)
  else
    echo "# mixed_bfloat16: not available on this CPU (step_bench --cpu-info): no profile"
  fi
  for precision in "${precisions[@]}"; do
    for batch in 64 256; do
      OMP_NUM_THREADS=2 "$step_bench" "$job" "$batch" "$steps" cpu eager "$precision" --profile
      echo
    done
  done
}
if [ "$profile" = only ]; then
  profile_tables
  exit 0
fi

. scripts/torch-at-best.sh
torch_install
torch() { torch_python bench/step_torch.py "$@" "${torch_job[@]}"; }  # OMP_NUM_THREADS threads

cpu_info=$("$step_bench" --cpu-info)
flags=$( (lscpu 2>/dev/null | sed -n 's/^Flags:[[:space:]]*//p'; grep -m1 '^flags' /proc/cpuinfo) | tr ' ' '\n')
have() { if grep -qx "$1" <<<"$flags"; then echo "$1"; else echo "no-$1"; fi; }
if [ ${#torch_job[@]} -eq 0 ]; then
  echo "# scripts/bench-step.sh: tutorial CNN, SGD momentum 0.9, $steps timed steps after 10 warm-up; samples/s"
else
  echo "# scripts/bench-step.sh --job $job: its model and optimizer, $steps timed steps after 10 warm-up; samples/s"
fi
bf16=$(sed -n 's/^mixed_bfloat16 //p' <<<"$cpu_info")
echo "# CPU: $(sed -n 's/^cpu_model //p' <<<"$cpu_info"); oneDNN ISA: $(sed -n 's/^onednn_isa //p' <<<"$cpu_info"); lscpu flags: $(have avx512_bf16) $(have amx_bf16) $(have avx512f) $(have avx2); dtrain mixed_bfloat16: $bf16"
alternative=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
echo "# $(torch_python bench/step_torch.py --info) (LD_LIBRARY_PATH=$torch_openmp_blas; the system's libblas.so.3 alternative: ${alternative:-unknown})"
torch_calibrate "$steps"
torch_header
echo "# each cell: the median of $repeat runs, the four columns' runs alternated"
echo "threads batch dtrain_fp32 dtrain_bf16 pytorch_fp32 pytorch_bf16_autocast dtrain_fp32_vs_pytorch_fp32 dtrain_bf16_vs_pytorch_fp32 sgemm_peak_gflops paired_fp32_vs_pytorch_fp32 paired_bf16_vs_pytorch_fp32"
median() { if [ $# -eq 0 ]; then echo n/a; else printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; fi; }
ratio() { if [ "$1" = n/a ] || [ "$2" = n/a ]; then echo n/a; else awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; fi; }
for threads in 1 2; do
  for batch in 64 256; do
    export OMP_NUM_THREADS=$threads
    fp32s=() bf16s=() torch_fp32s=() torch_bf16s=() peaks=() paired_fp32=() paired_bf16=() rounds=()
    for ((r = 0; r < repeat; ++r)); do
      read -r _ _ _ fp32 _ peak _ < <("$step_bench" "$job" "$batch" "$steps" cpu eager float32)
      fp32s+=("$fp32") peaks+=("$peak")
      bf16_rate=n/a
      if [ "$bf16" = supported ]; then
        read -r _ _ _ bf16_rate _ _ _ < <("$step_bench" "$job" "$batch" "$steps" cpu eager mixed_bfloat16)
        bf16s+=("$bf16_rate")
      fi
      read -r _ _ _ torch_fp32 _ torch_fp32_layout < <(torch "$batch" "$threads" "$steps" float32)
      # PyTorch's bf16 autocast needs the same instructions (its oneDNN refuses the convolution
      # without them, e.g. under ONEDNN_MAX_CPU_ISA=AVX2).
      torch_bf16=n/a torch_bf16_layout=
      if [ "$bf16" = supported ]; then
        read -r _ _ _ torch_bf16 _ torch_bf16_layout < <(torch "$batch" "$threads" "$steps" autocast_bf16)
        torch_bf16s+=("$torch_bf16")
      fi
      torch_fp32s+=("$torch_fp32")
      paired_fp32+=("$(ratio "$fp32" "$torch_fp32")")
      [ "$bf16_rate" = n/a ] || paired_bf16+=("$(ratio "$bf16_rate" "$torch_fp32")")
      rounds+=("# round $((r + 1)): $fp32 $bf16_rate $torch_fp32${torch_fp32_layout:+ ($torch_fp32_layout)} $torch_bf16${torch_bf16_layout:+ ($torch_bf16_layout)}")
    done
    fp32=$(median "${fp32s[@]}") peak=$(median "${peaks[@]}")
    bf16_rate=$(median "${bf16s[@]}")
    torch_fp32=$(median "${torch_fp32s[@]}") torch_bf16=$(median "${torch_bf16s[@]}")
    echo "$threads $batch $fp32 $bf16_rate $torch_fp32 $torch_bf16 $(ratio "$fp32" "$torch_fp32") $(ratio "$bf16_rate" "$torch_fp32") $peak $(median "${paired_fp32[@]}") $(median "${paired_bf16[@]}")"
    printf '%s\n' "${rounds[@]}"
  done
done
unset OMP_NUM_THREADS
if [ "$profile" = also ]; then
  echo
  profile_tables
fi
