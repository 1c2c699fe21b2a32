#!/usr/bin/env bash
# Recovery time broken down by phase: SIGKILL of one of two workers of the main job's model and
# data, to the group's first completed step after the restart (bench/recovery_breakdown.py).
#   scripts/bench-recovery.sh [RUNS=5] [BUILD=build]
#   scripts/bench-recovery.sh --dtrain LABEL=PATH --dtrain LABEL=PATH... [RUNS=5]
# Each --dtrain adds a launcher binary to compare (for example one built from an older commit;
# its dtrain-worker: beside it or in ../worker, as the launcher looks); runs alternate between
# them, and nothing is built. Without --dtrain: BUILD's launcher, built first.
set -euo pipefail
cd "$(dirname "$0")/.."
compared=() positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dtrain)
      [[ "${2:-}" == *=* ]] || { echo "--dtrain needs LABEL=PATH" >&2; exit 2; }
      compared+=(--dtrain "$2")
      shift 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
runs=${positional[0]:-5}
if [ ${#compared[@]} -gt 0 ]; then
  [ ${#positional[@]} -le 1 ] || { echo "--dtrain takes no BUILD" >&2; exit 2; }
  echo "# scripts/bench-recovery.sh: $(nproc) cores, ${compared[*]}"
  exec python3 bench/recovery_breakdown.py "${compared[@]}" "$runs"
fi
build=${positional[1]:-build}
bash scripts/build.sh "$build" >/dev/null
echo "# scripts/bench-recovery.sh: $(nproc) cores, build $build"
python3 bench/recovery_breakdown.py "$build/launcher/dtrain" "$runs"
