# Sourced by scripts/bench-step.sh and scripts/bench-worker.sh: PyTorch's CPU build (Debian's
# python3-torch) at its best, for their comparisons (docs/benchmarks.md, issue 29's fifth and
# sixth sessions). Debian builds it with BLAS_INFO=generic, so its dense layers call the system
# libblas.so.3 (the reference BLAS unless an OpenBLAS is the alternative): torch_install installs
# OpenBLAS's OpenMP build (libopenblas0-openmp) and torch_python puts it first on
# LD_LIBRARY_PATH for the PyTorch runs only (the system's alternative is not changed), so
# OpenBLAS and PyTorch share one OpenMP runtime and thread count.
#
# Its step allocates each gradient anew, and glibc hands blocks this large back to the kernel and
# maps them again, so every step page-faults through the 11 MB of the dense layer's gradients;
# PyTorch's CPU tuning guide prescribes jemalloc or tcmalloc, which keep them, and these glibc
# tunables do the same. And OpenBLAS 0.3.21 runs its AVX2 (Haswell) kernels on Zen 4 and 5,
# which it predates: where the CPU has AVX-512, torch_calibrate times its SkylakeX kernels
# against its own choice and keeps the faster.
torch_openmp_blas=/usr/lib/x86_64-linux-gnu/openblas-openmp
torch_malloc=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295
torch_core=
torch_core_choice="OpenBLAS's own choice (no AVX-512 here)"

torch_install() {
  if ! /usr/bin/python3 -c "import torch" 2>/dev/null || [ ! -e "$torch_openmp_blas/libblas.so.3" ] ||
    ! dpkg -s libopenblas0-pthread >/dev/null 2>&1; then
    echo "# installing python3-torch, libopenblas0-openmp and libopenblas0-pthread for the comparison" >&2
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
      python3-torch libopenblas0-openmp libopenblas0-pthread >/dev/null
  fi
}

# torch_python SCRIPT ARGS...: Debian's python3 with PyTorch at its best, OMP_NUM_THREADS threads.
torch_python() {
  env GLIBC_TUNABLES=$torch_malloc ${torch_core:+OPENBLAS_CORETYPE=$torch_core} \
    LD_LIBRARY_PATH=$torch_openmp_blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} /usr/bin/python3 "$@"
}

# torch_calibrate STEPS: on an AVX-512 CPU, bench/step_torch.py's fp32 step (1 thread, batch 64,
# STEPS steps) three times with OpenBLAS's own choice and three with SkylakeX, alternated; sets
# torch_core to the faster and torch_core_choice to a line saying so.
torch_calibrate() {
  local flags own=() skylakex=() own_rate skylakex_rate
  flags=$( (lscpu 2>/dev/null | sed -n 's/^Flags:[[:space:]]*//p'; grep -m1 '^flags' /proc/cpuinfo) | tr ' ' '\n')
  grep -qx avx512f <<<"$flags" || return 0
  torch_core=
  for _ in 1 2 3; do
    own+=("$(OMP_NUM_THREADS=1 torch_python bench/step_torch.py 64 1 "$1" float32 | awk '{ print $4 }')")
    skylakex+=("$(torch_core=SkylakeX OMP_NUM_THREADS=1 torch_python bench/step_torch.py 64 1 "$1" float32 | awk '{ print $4 }')")
  done
  own_rate=$(printf '%s\n' "${own[@]}" | sort -g | sed -n 2p)
  skylakex_rate=$(printf '%s\n' "${skylakex[@]}" | sort -g | sed -n 2p)
  if awk -v a="$skylakex_rate" -v b="$own_rate" 'BEGIN { exit !(a > b) }'; then torch_core=SkylakeX; fi
  torch_core_choice="${torch_core:-its own choice}: PyTorch fp32, 1 thread, batch 64, median of 3: own choice $own_rate, SkylakeX $skylakex_rate samples/s"
}

# One header line: the glibc tunables and the OpenBLAS kernels the PyTorch runs use.
torch_header() {
  echo "# PyTorch runs with GLIBC_TUNABLES=$torch_malloc (freed blocks kept, as jemalloc or tcmalloc would); OpenBLAS kernels: $torch_core_choice"
}
