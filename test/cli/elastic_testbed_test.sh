#!/usr/bin/env bash
# CTest test_elastic_testbed: the recipe of docs/multi-host.md ("Trying elastic membership on one
# machine") as a user runs it. scripts/elastic-testbed.sh makes its two hosts in a temp folder
# (names and /24 of its own, so a test bed a person keeps up is not touched); cut and restore
# take h1 off the network and back; then the elastic job, cut to 2 epochs, trains while the host
# list drops h1 and names it again. Passes when the launch exits 0 with one shrink to 2 workers
# (why: the list) and one grow to 4 in events.jsonl, no restart, and `down` leaves no namespace,
# link, sshd or folder behind. It does not compare models (test_multi_host_elastic does).
# Exit 77 (skipped) where the machine cannot make the hosts, unless DTRAIN_REQUIRE_TESTBEDS=1.
#   elastic_testbed_test.sh BUILD_DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: elastic_testbed_test.sh BUILD_DIR" >&2; exit 2; }
dtrain=$(cd "$1" && pwd)/launcher/dtrain
script=$(cd "$(dirname "$0")/../.." && pwd)/scripts/elastic-testbed.sh
[ -x "$dtrain" ] || { echo "test_elastic_testbed: no $dtrain: build dtrain first" >&2; exit 1; }

export DTRAIN_TESTBED_PREFIX=dtb-t$(($$ % 100000))
export DTRAIN_TESTBED_NET=10.213.$((100 + $$ % 150))
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-elastic-testbed-XXXXXX")
dir=$tmp/bed  # the test bed's folder: `up` makes it, `down` removes it
out=$tmp/launch.log
events=$dir/run/events.jsonl
launcher=""
started=$SECONDS

fail() {
  echo "test_elastic_testbed: FAIL: $*" >&2
  if [ -f "$out" ]; then echo "--- the launcher's last lines:" >&2; tail -n 30 "$out" >&2; fi
  exit 1
}
cleanup() {
  local rc=$?
  if [ -n "$launcher" ] && kill -0 "$launcher" 2>/dev/null; then
    kill -TERM "$launcher" 2>/dev/null || true  # it stops its workers (grace 5 s)
    for _ in $(seq 100); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$launcher" 2>/dev/null || true
  fi
  bash "$script" down "$dir" >/dev/null 2>&1 || true
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT

# Waits up to $1 seconds for the command after it to succeed while the launcher runs.
wait_for() {
  local seconds=$1 deadline
  shift
  deadline=$((SECONDS + seconds))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    if [ -n "$launcher" ] && ! kill -0 "$launcher" 2>/dev/null; then return 1; fi
    sleep 0.2
  done
}
count() {
  local n
  n=$(grep -c "\"event\":\"$1\"" "$events" 2>/dev/null) || true
  echo "${n:-0}"
}
has_events() { [ "$(count "$1")" -ge "$2" ]; }
# Worker 0's global step from state.json (the first "global_step" there); empty before it has one.
global_step() {
  local steps
  steps=$(grep -o '"global_step":[0-9]*' "$dir/run/state.json" 2>/dev/null) || true
  steps=${steps%%$'\n'*}
  echo "${steps#*:}"
}
past_step() { [ "$(global_step)" -ge "$1" ] 2>/dev/null; }
h1_answers() { ssh -F "$dir/ssh_config" -o ConnectTimeout=2 "$DTRAIN_TESTBED_NET.2" true 2>/dev/null; }

# 1. Up, or skip where the machine cannot.
set +e
bash "$script" up "$dir" >"$tmp/up.log" 2>&1
rc=$?
set -e
if [ "$rc" -eq 2 ] && [ "${DTRAIN_REQUIRE_TESTBEDS:-}" != 1 ]; then
  echo "test_elastic_testbed: skipped: the test bed cannot run here:"
  cat "$tmp/up.log"
  exit 77
fi
if [ "$rc" -eq 2 ]; then
  cat "$tmp/up.log" >&2
  fail "the elastic test bed cannot run and DTRAIN_REQUIRE_TESTBEDS=1 requires it"
fi
[ "$rc" -eq 0 ] || { cat "$tmp/up.log" >&2; fail "elastic-testbed.sh up exited $rc"; }
for f in elastic-job.json hosts discover-hosts ssh_config; do
  [ -e "$dir/$f" ] || fail "up wrote no $dir/$f"
done

# 2. cut and restore: h1 stops answering and answers again.
h1_answers || fail "h1 does not take an ssh login after up"
bash "$script" cut h1 "$dir" >/dev/null
if h1_answers; then fail "h1 still answers after cut"; fi
status=$(bash "$script" status "$dir")
grep -q "h1 .*cable cut" <<<"$status" || fail "status does not show h1's cable cut: $status"
bash "$script" restore h1 "$dir" >/dev/null
wait_for 5 h1_answers || fail "h1 does not answer 5 s after restore"

# 3. The elastic job, 2 epochs (470 steps of 4 workers), launched as the recipe does.
sed -i 's/"epochs": 5,/"epochs": 2,/' "$dir/elastic-job.json"
grep -q '"epochs": 2,' "$dir/elastic-job.json" || fail "the job file has no \"epochs\": 5 to shorten"
(cd "$tmp" && exec "$dtrain" launch "$dir/elastic-job.json") >"$out" 2>&1 &
launcher=$!
wait_for 60 past_step 20 || fail "the job did not reach step 20 within 60 s"
bash "$script" drop h1 "$dir" >/dev/null
wait_for 20 has_events shrink 1 || fail "no shrink event within 20 s of dropping h1 from the list"
step=$(global_step)
wait_for 20 past_step $((step + 5)) || fail "the shrunk group did not train on (step $step)"
bash "$script" add h1 "$dir" >/dev/null
wait_for 30 has_events grow 1 || fail "no grow event within 30 s of listing h1 again"
set +e
wait "$launcher"
rc=$?
set -e
launcher=""
[ "$rc" -eq 0 ] || fail "dtrain launch exited $rc"

# 4. What the launcher recorded.
[ "$(count shrink)" -eq 1 ] || fail "$(count shrink) shrink events, expected 1"
[ "$(count grow)" -eq 1 ] || fail "$(count grow) grow events, expected 1"
[ "$(count restart)" -eq 0 ] || fail "the group restarted: $(grep '"restart"' "$events")"
shrink=$(grep '"event":"shrink"' "$events")
grow=$(grep '"event":"grow"' "$events")
grep -q '"world_size":2,"host":"'"$DTRAIN_TESTBED_NET"'.2".*"why":"not in elastic.host_discovery'"'"'s list"' <<<"$shrink" ||
  fail "the shrink is not h1's to 2 workers by the list: $shrink"
grep -q '"world_size":4,"host":"'"$DTRAIN_TESTBED_NET"'.2"' <<<"$grow" ||
  fail "the grow is not h1's to 4 workers: $grow"
grep -q "host $DTRAIN_TESTBED_NET.2 is gone (not in elastic.host_discovery's list): the group shrinks to 2 worker(s)" "$out" ||
  fail "the launcher's output does not say the group shrank"
grep -q "host $DTRAIN_TESTBED_NET.2 is back: the group grows to 4 worker(s)" "$out" ||
  fail "the launcher's output does not say the group grew"
grep -q '"event":"end","status":"succeeded"' "$events" || fail "events.jsonl has no successful end"

# 5. Down leaves nothing.
bash "$script" down "$dir" >/dev/null || fail "elastic-testbed.sh down failed"
for ns in "$DTRAIN_TESTBED_PREFIX-h0" "$DTRAIN_TESTBED_PREFIX-h1"; do
  [ ! -e "/run/netns/$ns" ] || fail "namespace $ns is left after down"
done
links=$(ip -o link show | grep " $DTRAIN_TESTBED_PREFIX-" || true)
[ -z "$links" ] || fail "links are left after down: $links"
sshds=$(pgrep -af "sshd.*$dir/" || true)
[ -z "$sshds" ] || fail "an sshd of the test bed runs after down: $sshds"
[ ! -e "$dir" ] || fail "$dir is left after down"
echo "test_elastic_testbed: shrink and grow on two namespace hosts, down clean, in $((SECONDS - started)) s"
