#!/usr/bin/env bash
# Builds dtrain (scripts/build.sh build) and installs `dtrain` and `dtrain-worker` side by side into
# PREFIX/bin, plus dtrain's bash completion, with `cmake --install`; then `dtrain` works from any
# folder. It does not run the set-up (scripts/setup.sh) or any test.
#   scripts/install.sh [PREFIX] [BUILD_DIR]
# PREFIX defaults to $DTRAIN_PREFIX, else /usr/local. With BUILD_DIR it builds nothing and installs
# the two programs already built there (scripts/demo.sh builds only them, in build-demo/).
# Remove with: rm PREFIX/bin/dtrain PREFIX/bin/dtrain-worker PREFIX/share/bash-completion/completions/dtrain
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-${DTRAIN_PREFIX:-/usr/local}}
build=${2:-}
if [ -z "$build" ]; then
  build=build
  bash scripts/build.sh build
fi
for program in launcher/dtrain worker/dtrain-worker; do
  if [ ! -x "$build/$program" ]; then
    echo "install: $build/$program is not built" >&2
    exit 1
  fi
done

SUDO=
if ! mkdir -p "$prefix" 2>/dev/null || [ ! -w "$prefix" ]; then
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "install: cannot write to $prefix; run as root or pass a PREFIX you own" >&2
    exit 1
  fi
fi
$SUDO cmake --install "$build" --prefix "$prefix"

found=$(command -v dtrain || true)
if [ "$found" != "$prefix/bin/dtrain" ]; then
  echo "install: $prefix/bin is not first on PATH (dtrain there: ${found:-none}); add it:" \
       "export PATH=\"$prefix/bin:\$PATH\"" >&2
fi
echo "install: $("$prefix/bin/dtrain" --version) installed in $prefix/bin"
