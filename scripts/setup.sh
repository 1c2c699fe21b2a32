#!/usr/bin/env bash
# Installs every build and run dependency of dtrain with apt on Debian 12; with --tests, also the
# packages only tests and CI need (Debian's python3-torch, clang-format for the format check);
# with --minimal, only what building dtrain and running it on this machine need (scripts/demo.sh).
# Idempotent: when every package is present it only checks and returns in about a second.
# It does not build anything; scripts/build.sh does that.
#   scripts/setup.sh [--tests | --minimal]
set -euo pipefail

mode=${1:-}
case "$mode" in
  "" | --tests | --minimal) ;;
  *) echo "setup: unknown argument '$mode' (expected --tests, --minimal or nothing)" >&2; exit 2 ;;
esac

# --minimal: the compiler, CMake, the libraries (catch2 too: CMake looks for it when it
# configures), the Fashion-MNIST data, and python3 for the examples' small scripts.
packages=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev libboost-program-options-dev
  rapidjson-dev libspdlog-dev libfmt-dev catch2
  zlib1g-dev libssl-dev libdnnl-dev libre2-dev libhdf5-dev
  libpng-dev libjpeg62-turbo-dev
  dataset-fashion-mnist
  python3
)
# The default adds workers on other hosts (ssh) and the test beds of multi-host and Slurm runs
# (sshd in network namespaces, a Slurm cluster with munge).
if [ "$mode" != "--minimal" ]; then
  packages+=(procps tmux openssh-server openssh-client iproute2
             slurmctld slurmd slurm-client munge)
fi
# --tests: also what only tests use (PyTorch for the DDP and model-loading tests; ~1 minute) and
# clang-format 14 for scripts/format.sh --check; h5py reads the Keras archive's weights
# (test/train/read_keras_archive.py); PIL writes the PNG and JPEG files of the
# image tests; ccache, through which scripts/build.sh compiles, so that CI's second build reuses
# the objects its first one compiled the same way (docs/testing.md); fuse3 and python3-fusepy for
# the slow disk of the freeze watch's tests (test/support/slow_fs.py); clang 14 and its OpenMP
# headers for scripts/clang-check.sh.
if [ "$mode" = "--tests" ]; then
  packages+=(python3-torch python3-numpy python3-pil clang-format ccache python3-fusepy fuse3
             clang-14 libomp-14-dev python3-h5py)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "setup: must run as root (or with sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
else
  SUDO=
fi

export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get update -qq; then
  echo "setup: 'apt-get update' failed; check the network and /etc/apt/sources.list" >&2
  exit 1
fi
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/dtrain-setup-apt.log 2>&1; then
  tail -n 20 /tmp/dtrain-setup-apt.log >&2
  echo "setup: 'apt-get install ${missing[*]}' failed (full log: /tmp/dtrain-setup-apt.log)" >&2
  exit 1
fi
echo "setup: done"
