#!/usr/bin/env bash
# Formats dtrain's C++ sources with clang-format (.clang-format at the root).
#   scripts/format.sh          rewrite files in place
#   scripts/format.sh --check  list files that are not formatted, exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cc' '*.cu')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in $files; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then echo "$f"; bad=1; fi
  done
  exit $bad
fi
clang-format -i $files
