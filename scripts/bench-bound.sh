#!/usr/bin/env bash
# What issue 29's aims ask of the CPU: for each cell of scripts/bench-step.sh's table (threads 1
# and 2, batch 64 and 256), PyTorch's float32 step at its best (scripts/torch-at-best.sh), dtrain's
# step in float32 and mixed_bfloat16 (bench/step_bench), and the bound bench/product_bound sets:
# the step's time if everything but its dense products (each in oneDNN's fastest form, operands
# in whatever layout suits it, cold or warm caches), its optimizer's pass (SGD with momentum, as the
# backend runs it) and its convolution's output passes at memory speed (one write, two reads,
# 16-bit in bf16; the arithmetic free) were free. As samples/s, and as ratios to PyTorch float32:
# max_* is the highest ratio a layer-by-layer step doing those products and that update could
# reach on this CPU; *_aim_needs is the share of the bound a step must reach for the aim (2x
# PyTorch float32 in float32, 3x in bf16; 1.3x and 2x with --job): above 1 no such step can;
# dtrain_*_of_bound is the share dtrain reaches. Under each row, in ms: the products, the update and the convolution
# passes, and the ratios with the update and the convolution free too (products only).
# The bound also counts the convolutions' own products (oneDNN's primitives, every tensor already
# in the blocked layout each chose, no reorder) wherever dtrain runs them: nearly nothing for the
# tutorial CNN (its one convolution has a single input channel: dtrain's direct loops, passes
# only), nearly all of a ResNet's step.
#   scripts/bench-bound.sh [STEPS] [BUILD_DIR] [--repeat N] [--job FILE]
# STEPS (default 50) timed steps after 10 warm-up for the two steps; BUILD_DIR (default build);
# --repeat N (default 3) alternates the four runs of a cell N times and prints medians. --job FILE
# bounds that job's model (e.g. configs/resnet-fashion-mnist.json, with the job's optimizer in
# both steps; PyTorch builds the same graph, bench/step_torch.py --job) against issue 44's aims
# (1.3x PyTorch float32 in float32, 2x in bf16) instead of the tutorial CNN's (2x, 3x).
set -euo pipefail
cd "$(dirname "$0")/.."
positional=() repeat=3 job=configs/fashion-mnist-2workers.json torch_job=() aim_fp32=2 aim_bf16=3
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat=$2; shift ;;
    --job) job=$2; torch_job=(--job "$2"); aim_fp32=1.3 aim_bf16=2; shift ;;
    -*) echo "usage: scripts/bench-bound.sh [STEPS] [BUILD_DIR] [--repeat N] [--job FILE]" >&2; exit 2 ;;
    *) positional+=("$1") ;;
  esac
  shift
done
steps=${positional[0]:-50}
build=${positional[1]:-build}
[ -f "$job" ] || { echo "bench-bound: no job file $job" >&2; exit 2; }
bash scripts/build.sh "$build" >/dev/null
. scripts/torch-at-best.sh
torch_install
cpu_info=$("$build/bench/step_bench" --cpu-info)
bf16=$(sed -n 's/^mixed_bfloat16 //p' <<<"$cpu_info")
if [ ${#torch_job[@]} -eq 0 ]; then
  echo "# scripts/bench-bound.sh: tutorial CNN, SGD momentum 0.9; samples/s; $steps timed steps after 10 warm-up; bounds: bench/product_bound, the faster of the medians of 15 cold and 15 warm timings per form"
else
  echo "# scripts/bench-bound.sh --job $job: its model and optimizer; samples/s; $steps timed steps after 10 warm-up; bounds: bench/product_bound, the faster of the medians of 15 cold and 15 warm timings per form; aims ${aim_fp32}x (fp32) and ${aim_bf16}x (bf16) PyTorch fp32"
fi
echo "# CPU: $(sed -n 's/^cpu_model //p' <<<"$cpu_info"); oneDNN ISA: $(sed -n 's/^onednn_isa //p' <<<"$cpu_info"); dtrain mixed_bfloat16: $bf16"
torch_calibrate "$steps"
torch_header
echo "# each cell: the median of $repeat rounds, the four runs alternated; bound = batch / (dense products + convolution products + optimizer pass + convolution passes), products_only = batch / (dense + convolution products)"
echo "threads batch pytorch_fp32 dtrain_fp32 bound_fp32 dtrain_bf16 bound_bf16 dtrain_fp32_vs_pytorch max_fp32_vs_pytorch dtrain_bf16_vs_pytorch max_bf16_vs_pytorch fp32_aim_needs bf16_aim_needs dtrain_fp32_of_bound dtrain_bf16_of_bound"
median() { if [ $# -eq 0 ]; then echo n/a; else printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; fi; }
ratio() { if [ "$1" = n/a ] || [ "$2" = n/a ]; then echo n/a; else awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; fi; }
rate() { if [ "$2" = n/a ]; then echo n/a; else awk -v b="$1" -v ms="$2" -v extra="${3:-0}" 'BEGIN { printf "%.0f", b / ((ms + extra) / 1000) }'; fi; }
for threads in 1 2; do
  for batch in 64 256; do
    export OMP_NUM_THREADS=$threads
    torchs=() fp32s=() bf16s=() fp32_ms=() bf16_ms=() sgd_ms=() conv32_ms=() conv16_ms=()
    convp32_ms=() convp16_ms=()
    for ((r = 0; r < repeat; ++r)); do
      read -r _ _ _ fp32 _ < <("$build/bench/step_bench" "$job" "$batch" "$steps" cpu eager float32)
      fp32s+=("$fp32")
      if [ "$bf16" = supported ]; then
        read -r _ _ _ rate_bf16 _ < <("$build/bench/step_bench" "$job" "$batch" "$steps" cpu eager mixed_bfloat16)
        bf16s+=("$rate_bf16")
      fi
      read -r _ _ products_fp32 products_bf16 sgd conv32 conv16 convp32 convp16 < <("$build/bench/product_bound" "$job" "$batch")
      # The convolutions' products count with the dense ones.
      products_fp32=$(awk -v a="$products_fp32" -v b="$convp32" 'BEGIN { print a + b }')
      fp32_ms+=("$products_fp32") sgd_ms+=("$sgd") conv32_ms+=("$conv32") conv16_ms+=("$conv16")
      convp32_ms+=("$convp32")
      if [ "$products_bf16" != n/a ]; then
        bf16_ms+=("$(awk -v a="$products_bf16" -v b="$convp16" 'BEGIN { print a + b }')")
        convp16_ms+=("$convp16")
      fi
      read -r _ _ _ torch_fp32 _ < <(torch_python bench/step_torch.py "$batch" "$threads" "$steps" float32 "${torch_job[@]}")
      torchs+=("$torch_fp32")
    done
    torch_fp32=$(median "${torchs[@]}") fp32=$(median "${fp32s[@]}") bf16_rate=$(median "${bf16s[@]}")
    p_fp32=$(median "${fp32_ms[@]}") p_bf16=$(median "${bf16_ms[@]}") sgd=$(median "${sgd_ms[@]}")
    conv32=$(median "${conv32_ms[@]}") conv16=$(median "${conv16_ms[@]}")
    bound_fp32=$(rate "$batch" "$p_fp32" "$(awk -v a="$sgd" -v b="$conv32" 'BEGIN { print a + b }')")
    bound_bf16=$(rate "$batch" "$p_bf16" "$(awk -v a="$sgd" -v b="$conv16" 'BEGIN { print a + b }')")
    only_fp32=$(rate "$batch" "$p_fp32") only_bf16=$(rate "$batch" "$p_bf16")
    aim2=$(awk -v t="$torch_fp32" -v a="$aim_fp32" 'BEGIN { print a * t }') aim3=$(awk -v t="$torch_fp32" -v a="$aim_bf16" 'BEGIN { print a * t }')
    echo "$threads $batch $torch_fp32 $fp32 $bound_fp32 $bf16_rate $bound_bf16 $(ratio "$fp32" "$torch_fp32") $(ratio "$bound_fp32" "$torch_fp32") $(ratio "$bf16_rate" "$torch_fp32") $(ratio "$bound_bf16" "$torch_fp32") $(ratio "$aim2" "$bound_fp32") $(ratio "$aim3" "$bound_bf16") $(ratio "$fp32" "$bound_fp32") $(ratio "$bf16_rate" "$bound_bf16")"
    echo "# ms: fp32 products $p_fp32 (convolutions' $(median "${convp32_ms[@]}")), bf16 products $p_bf16 (convolutions' $(median "${convp16_ms[@]}")), optimizer pass $sgd, convolution passes fp32 $conv32, bf16 $conv16; products only: fp32 $(ratio "$only_fp32" "$torch_fp32")x, bf16 $(ratio "$only_bf16" "$torch_fp32")x PyTorch fp32"
  done
done
