#!/usr/bin/env bash
# Builds dtrain (scripts/build.sh build) and installs `dtrain` and `dtrain-worker` side by side into
# PREFIX/bin, plus dtrain's bash completion, with `cmake --install`; then `dtrain` works from any
# folder. It does not run the set-up (scripts/setup.sh) or any test.
#   scripts/install.sh [PREFIX]    PREFIX defaults to $DTRAIN_PREFIX, else /usr/local
# Remove with: rm PREFIX/bin/dtrain PREFIX/bin/dtrain-worker PREFIX/share/bash-completion/completions/dtrain
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-${DTRAIN_PREFIX:-/usr/local}}
bash scripts/build.sh build

SUDO=
if ! mkdir -p "$prefix" 2>/dev/null || [ ! -w "$prefix" ]; then
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
  else
    echo "install: cannot write to $prefix; run as root or pass a PREFIX you own" >&2
    exit 1
  fi
fi
$SUDO cmake --install build --prefix "$prefix"

found=$(command -v dtrain || true)
if [ "$found" != "$prefix/bin/dtrain" ]; then
  echo "install: $prefix/bin is not first on PATH (dtrain there: ${found:-none}); add it:" \
       "export PATH=\"$prefix/bin:\$PATH\"" >&2
fi
echo "install: $("$prefix/bin/dtrain" --version) installed in $prefix/bin"
