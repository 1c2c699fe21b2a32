#!/usr/bin/env bash
# Makes a self-contained folder that runs dtrain's GPU build on a machine without Debian's
# packages (the lent GPU machine: CUDA, cuDNN and NCCL come from its PyTorch installation).
#   scripts/bundle.sh [BUILD_DIR] [OUT_DIR]      (defaults: build-gpu, build-bundle)
# BUILD_DIR must be a CUDA build (scripts/build.sh build-gpu -DCMAKE_BUILD_TYPE=Release). The
# folder holds stripped programs in bin/, the non-CUDA shared libraries they need in lib/ (big ones
# xz-compressed, unpacked by env.sh), the Fashion-MNIST files in data/, configs/ and scripts.
# It does not copy CUDA's own libraries: env.sh finds them on the target machine.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
out=${2:-build-bundle}
[ -f "$build/CMakeCache.txt" ] || { echo "bundle: $build is not a build folder" >&2; exit 2; }
grep -q '^DTRAIN_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "bundle: $build is not a CUDA build (DTRAIN_WITH_CUDA is OFF)" >&2; exit 2; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data" "$out/configs" "$out/scripts"
programs=(launcher/dtrain worker/dtrain-worker test/gpu/test_gpu bench/step_bench
          bench/allreduce_bench)
for p in "${programs[@]}"; do
  [ -x "$build/$p" ] || continue
  cp "$build/$p" "$out/bin/"
  strip "$out/bin/$(basename "$p")"
done

# Libraries the programs load that the target lacks: everything ldd resolves except glibc's own
# and CUDA's (which come from the target's Python environment).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink)'
for bin in "$out"/bin/*; do
  ldd "$bin" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ $name =~ $skip ]]; then continue; fi
  cp -L "$path" "$out/lib/$name"
done
# libdnnl is ~40 MB raw: ship it compressed.
for big in "$out"/lib/*; do
  if [ "$(stat -c %s "$big")" -gt 8000000 ]; then xz -T0 -6 "$big"; fi
done

cp /usr/share/datasets/fashion-mnist/*.gz "$out/data/"
cp configs/*.json "$out/configs/"
cp bench/*.py scripts/bench-gpu.sh scripts/gpu-runs.sh "$out/scripts/"

cat >"$out/env.sh" <<'EOF'
# Source me: unpacks the compressed libraries once and puts the bundle's lib/ and the target's
# CUDA libraries (found inside its Python environment or /usr/local/cuda) on LD_LIBRARY_PATH.
BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export BUNDLE
for f in "$BUNDLE"/lib/*.xz; do
  [ -e "$f" ] || continue
  target="${TMPDIR:-/tmp}/dtrain-bundle-lib"
  mkdir -p "$target"
  [ -e "$target/$(basename "${f%.xz}")" ] || xz -dc "$f" >"$target/$(basename "${f%.xz}")"
  BUNDLE_EXTRA_LIB=$target
done
cuda_dirs=$(find / -xdev \( -name 'libcudnn.so.9' -o -name 'libnccl.so.2' -o -name 'libcublas.so.1*' \
  -o -name 'libcudart.so.1*' \) -not -path '*/proc/*' 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$BUNDLE/lib:${BUNDLE_EXTRA_LIB:+$BUNDLE_EXTRA_LIB:}${cuda_dirs}${LD_LIBRARY_PATH:-}"
export PATH="$BUNDLE/bin:$PATH"
EOF
du -sh "$out"
echo "bundle: $out ($(du -sm "$out" | cut -f1) MiB); on the target: source $out/env.sh"
