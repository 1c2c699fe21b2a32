#!/usr/bin/env bash
# Formats dtrain's C++ and CUDA sources (every tracked *.h, *.cc, *.cu, *.cuh) with clang-format
# and the .clang-format at the root. It does not touch CMake, shell or Python files.
#   scripts/format.sh          rewrite the files in place
#   scripts/format.sh --check  change nothing; list the files clang-format would change and exit 1
#                              if there is any (scripts/test.sh, and so CI, runs this first)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null 2>&1; then
  echo "format: clang-format not found: run scripts/setup.sh (clang-format)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
case "${1:-}" in
  "")
    clang-format -i "${files[@]}"
    ;;
  --check)
    # One clang-format for every file; each misformatted spot is an "error:" line naming its file.
    report=$(clang-format --dry-run --Werror "${files[@]}" 2>&1) && exit 0
    bad=$(printf '%s\n' "$report" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' | sort -u)
    if [ -z "$bad" ]; then
      printf '%s\n' "$report" >&2  # clang-format failed for another reason: show it whole
      echo "format: clang-format --dry-run failed" >&2
      exit 1
    fi
    printf '%s\n' "$bad"
    echo "format: $(printf '%s\n' "$bad" | wc -l) file(s) not formatted; run scripts/format.sh" >&2
    exit 1
    ;;
  *)
    echo "usage: scripts/format.sh [--check]" >&2
    exit 2
    ;;
esac
