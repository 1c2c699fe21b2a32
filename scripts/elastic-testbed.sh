#!/usr/bin/env bash
# Elastic membership (docs/design.md#elastic-membership) on one machine, the recipe of
# docs/multi-host.md ("Trying elastic membership on one machine"): two "hosts" that are network
# namespaces on a bridge in this namespace, each with its own sshd taking root logins by a key
# made here, and an elastic job whose host list is a file, so a shrink and a grow can be watched
# without a second machine. The hosts share this machine's files and processes; only the network
# is apart, so it shows membership, not speed. Root only (the launch too); needs iproute2 and
# openssh-server.
#
#   scripts/elastic-testbed.sh up [DIR]           make the hosts, write DIR (default /tmp/dtrain-testbed)
#   scripts/elastic-testbed.sh drop|add HOST [DIR]  take HOST out of / back into DIR/hosts
#   scripts/elastic-testbed.sh cut|restore HOST [DIR]  pull / plug HOST's cable (its bridge port)
#   scripts/elastic-testbed.sh status [DIR]       what exists
#   scripts/elastic-testbed.sh down [DIR]         stop everything, delete the hosts and DIR
#
# HOST is h0, h1 or its address. DTRAIN_TESTBED_PREFIX (default dtb, names dtb-h0, dtb-h1,
# dtb-br) and DTRAIN_TESTBED_NET (default 10.213.0, the /24) let a second test bed run beside the
# first; `up` keeps both in DIR/testbed.env, which the other commands read.
# Exit 0 done, 1 failed, 2 usage or something missing here.
set -euo pipefail

sshd_program=/usr/sbin/sshd
port=23456  # each host's workers listen on this port and the next; namespaces apart, so both hosts
            # use the same ones

die() { echo "elastic-testbed: $*" >&2; exit 1; }
usage() { sed -n '10,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# The test bed's names, from DIR/testbed.env when `up` wrote one, else from the environment.
load_names() {
  prefix=${DTRAIN_TESTBED_PREFIX:-dtb}
  net=${DTRAIN_TESTBED_NET:-10.213.0}
  if [ -f "$dir/testbed.env" ]; then
    local key value
    while IFS='=' read -r key value; do
      case "$key" in
        prefix) prefix=$value ;;
        net) net=$value ;;
      esac
    done <"$dir/testbed.env"
  fi
  [[ "$prefix" =~ ^[a-z][a-z0-9-]{0,9}$ ]] ||
    { echo "elastic-testbed: prefix \"$prefix\" must be 1-10 of a-z, 0-9, - (interface names)" >&2; exit 2; }
  [[ "$net" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
    { echo "elastic-testbed: net \"$net\" must be the first three numbers of a /24, e.g. 10.213.0" >&2; exit 2; }
  bridge=$prefix-br
}
ns_of() { echo "$prefix-h$1"; }        # host i's namespace
port_of() { echo "$prefix-h${1}p"; }   # host i's port on the bridge (this namespace's end)
addr_of() { echo "$net.$(($1 + 1))"; }
ns_exists() { [ -e "/run/netns/$1" ]; }

# Host i from "h0", "<prefix>-h0" or the address.
host_index() {
  local i
  for i in 0 1; do
    case "$1" in
      "h$i" | "$(ns_of "$i")" | "$(addr_of "$i")") echo "$i"; return ;;
    esac
  done
  echo "elastic-testbed: unknown host \"$1\" (h0, h1, $(addr_of 0) or $(addr_of 1))" >&2
  exit 2
}

# Exit 2 naming everything this machine lacks.
check_prerequisites() {
  local missing=() tool
  [ "$(id -u)" -eq 0 ] || missing+=("root (network namespaces and sshd need it; run with sudo)")
  for tool in ip ssh ssh-keygen; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  [ -x "$sshd_program" ] || missing+=("$sshd_program (Debian's openssh-server)")
  getent passwd sshd >/dev/null 2>&1 || missing+=("the user sshd (reinstall openssh-server)")
  if [ "$(id -u)" -eq 0 ] && [ "$(getent shadow root | cut -d: -f2 | cut -c1)" = '!' ]; then
    # sshd without PAM refuses a locked account even for keys.
    missing+=("root login by key: root's password is locked; \`usermod -p '*' root\` allows keys only")
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "elastic-testbed: missing:" >&2
    printf '  - %s\n' "${missing[@]}" >&2
    if [ "$(id -u)" -ne 0 ] || [ ${#missing[@]} -gt 1 ]; then
      echo "scripts/setup.sh (as root) installs iproute2, openssh-client and openssh-server" >&2
    fi
    exit 2
  fi
}

# Refuses (exit 2) a /24 this namespace already has an address or a route in (other than the
# default route), or names that exist.
check_free() {
  local addresses routes
  addresses=$(ip -4 -o addr show)
  routes=$(ip -4 route show to match "$net.1" | grep -v '^default' || true)
  if grep -qF " inet $net." <<<"$addresses" || [ -n "$routes" ]; then
    echo "elastic-testbed: $net.0/24 is in use here; set DTRAIN_TESTBED_NET to a free /24" >&2
    exit 2
  fi
  local name
  for name in "$(ns_of 0)" "$(ns_of 1)"; do
    if ns_exists "$name"; then
      echo "elastic-testbed: namespace $name exists (another test bed?); run down first or set" \
        "DTRAIN_TESTBED_PREFIX" >&2
      exit 2
    fi
  done
  if ip link show "$bridge" >/dev/null 2>&1; then
    echo "elastic-testbed: link $bridge exists; run down first or set DTRAIN_TESTBED_PREFIX" >&2
    exit 2
  fi
}

build_network() {
  ip link add "$bridge" type bridge
  ip addr add "$net.254/24" dev "$bridge"
  ip link set "$bridge" up
  local i ns
  for i in 0 1; do
    ns=$(ns_of "$i")
    ip netns add "$ns"
    ip link add "$(port_of "$i")" type veth peer name eth0 netns "$ns"
    ip link set "$(port_of "$i")" master "$bridge" up  # no STP: it forwards at once
    ip -n "$ns" addr add "$(addr_of "$i")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
  done
}

write_ssh_files() {
  ssh-keygen -q -t ed25519 -N '' -C dtrain-testbed -f "$dir/id_ed25519"
  ssh-keygen -q -t ed25519 -N '' -C dtrain-testbed-host -f "$dir/host_ed25519"
  cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
  echo "$(addr_of 0),$(addr_of 1) $(cat "$dir/host_ed25519.pub")" >"$dir/known_hosts"
  # ServerAlive 1 s x 3: a cut session ends within about 4 s; ConnectTimeout 5: a try of a host
  # still cut off costs 5 s.
  cat >"$dir/ssh_config" <<EOF
Host *
  User root
  IdentityFile $dir/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $dir/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  RequestTTY no
  ConnectTimeout 5
  ServerAliveInterval 1
  ServerAliveCountMax 3
  ControlMaster no
  LogLevel ERROR
EOF
}

# Starts host i's sshd (it forks away; its pid is in DIR/sshd-h<i>.pid) and waits up to 5 s for a
# key login to work.
start_sshd() {
  local i=$1 addr ns
  addr=$(addr_of "$i")
  ns=$(ns_of "$i")
  cat >"$dir/sshd-h$i.conf" <<EOF
ListenAddress $addr:22
HostKey $dir/host_ed25519
PidFile $dir/sshd-h$i.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# Strict modes refuse keys in a folder under a world-writable one such as /tmp.
StrictModes no
# A launcher opens a session per worker, and one per try of a host.
MaxStartups 64
PrintMotd no
PrintLastLog no
X11Forwarding no
LogLevel INFO
EOF
  mkdir -p /run/sshd  # sshd's privilege separation folder; Debian's service makes it at boot
  ip netns exec "$ns" "$sshd_program" -f "$dir/sshd-h$i.conf" -E "$dir/sshd-h$i.log"
  for _ in $(seq 50); do
    if ssh -F "$dir/ssh_config" "$addr" true 2>/dev/null; then return; fi
    sleep 0.1
  done
  ssh -F "$dir/ssh_config" "$addr" true || true
  die "sshd on $addr ($ns) takes no key login after 5 s; its log $dir/sshd-h$i.log: $(tail -n 5 "$dir/sshd-h$i.log" 2>/dev/null)"
}

write_job() {
  local data='{"source": "idx", "dir": "/usr/share/datasets/fashion-mnist"}'
  if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "elastic-testbed: no Fashion-MNIST (Debian's dataset-fashion-mnist): the job trains on" \
      "synthetic data" >&2
    data='{"source": "synthetic", "examples": 8192}'
  fi
  printf '# one host a line; "drop" and "add" edit this file (dtrain reads it every second)\n%s\n%s\n' \
    "$(addr_of 0)" "$(addr_of 1)" >"$dir/hosts"
  cat >"$dir/discover-hosts" <<EOF
#!/bin/sh
# elastic.host_discovery: the hosts that may be used now, one a line.
exec cat '$dir/hosts'
EOF
  chmod 755 "$dir/discover-hosts"
  # The main job's model (configs/fashion-mnist-2workers.json) for 5 epochs: 1 to 2 minutes on
  # two cores. Two workers a host, as test/launcher/test_multi_host_elastic.cc has: a shrink
  # leaves two, each holding two virtual shards. (A group shrunk to one worker is not re-formed
  # when the host comes back: see docs/multi-host.md.) OMP_NUM_THREADS 1: both hosts share this
  # machine's cores.
  cat >"$dir/elastic-job.json" <<EOF
{
  "job": "elastic-testbed",
  "cluster": {"worker": ["$(addr_of 0):$port", "$(addr_of 0):$((port + 1))",
                         "$(addr_of 1):$port", "$(addr_of 1):$((port + 1))"]},
  "remote_shell": ["ssh", "-F", "$dir/ssh_config", "-T"],
  "elastic": {"min_workers": 2, "host_discovery": ["$dir/discover-hosts"],
              "discovery_interval_seconds": 1},
  "restart": {"max_restarts": 2, "backoff_seconds": 1, "grace_seconds": 5},
  "run_dir": "$dir/run",
  "env": {"OMP_NUM_THREADS": "1", "DTRAIN_CACHE_DIR": "$dir/cache"},
  "train": {
    "model": {"input_shape": [28, 28, 1], "layers": [
      {"type": "conv2d", "filters": 32, "kernel_size": 3, "activation": "relu"},
      {"type": "flatten"},
      {"type": "dense", "units": 128, "activation": "relu"},
      {"type": "dense", "units": 10}]},
    "loss": {"type": "sparse_categorical_crossentropy", "from_logits": true},
    "optimizer": {"type": "sgd", "learning_rate": 0.01, "momentum": 0.9},
    "data": $data,
    "per_worker_batch_size": 64,
    "epochs": 5,
    "validation": true,
    "seed": 42
  }
}
EOF
}

print_next_steps() {
  local dtrain here
  here=$(cd "$(dirname "$0")/.." && pwd)
  dtrain=$(command -v dtrain || true)
  for candidate in "$here/build/launcher/dtrain" "$here/build-cpu/launcher/dtrain"; do
    if [ -z "$dtrain" ] && [ -x "$candidate" ]; then dtrain=$candidate; fi
  done
  cat <<EOF
elastic-testbed: up: hosts h0 $(addr_of 0) (namespace $(ns_of 0)) and h1 $(addr_of 1) ($(ns_of 1)),
  two workers each; job $dir/elastic-job.json, host list $dir/hosts
Next:
  ${dtrain:-/path/to/dtrain} launch $dir/elastic-job.json
and from another shell while it trains (\`dtrain status $dir/run\` shows the world size):
  bash $0 drop h1 $dir      # out of the host list: "... is gone (not in elastic.host_discovery's list): the group shrinks to 2 worker(s) ..."
  bash $0 add h1 $dir       # listed again: "host $(addr_of 1) is back: the group grows to 4 worker(s) ..."
  bash $0 cut h1 $dir       # unreachable: the same shrink, blamed on the lost session
  bash $0 restore h1 $dir   # reachable again: it grows within about 5 s
Finally: bash $0 down $dir
EOF
}

cmd_up() {
  check_prerequisites
  if [ -f "$dir/testbed.env" ]; then
    echo "elastic-testbed: $dir holds a test bed already; \`$0 down $dir\` first" >&2
    exit 2
  fi
  if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
    echo "elastic-testbed: $dir exists and is not empty; name another folder" >&2
    exit 2
  fi
  check_free
  mkdir -p "$dir"
  chmod 700 "$dir"
  dir=$(cd "$dir" && pwd)
  printf 'prefix=%s\nnet=%s\n' "$prefix" "$net" >"$dir/testbed.env"
  trap 'echo "elastic-testbed: up failed; cleaning up" >&2; cmd_down >/dev/null' EXIT
  build_network
  write_ssh_files
  start_sshd 0
  start_sshd 1
  write_job
  trap - EXIT
  print_next_steps
}

# True while pid runs: a zombie has ended (sshd forked away, so whoever reaps it may take a while).
running() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# SIGTERM to every pid given, then SIGKILL to those left after 2 s.
stop_pids() {
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  local pid alive
  for _ in $(seq 20); do
    alive=0
    for pid in "$@"; do if running "$pid"; then alive=1; fi; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
}

cmd_down() {
  local i ns
  for i in 0 1; do
    ns=$(ns_of "$i")
    ns_exists "$ns" || continue
    # sshd, the sessions it took, and the agents and workers they started.
    # shellcheck disable=SC2046
    stop_pids $(ip netns pids "$ns" 2>/dev/null)
    ip netns del "$ns" 2>/dev/null || true  # takes eth0 and with it the bridge port
  done
  for i in 0 1; do ip link del "$(port_of "$i")" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
  # Only a folder `up` made (it holds testbed.env) is removed.
  if [ -f "$dir/testbed.env" ]; then
    rm -rf "$dir"
  elif [ -e "$dir" ]; then
    echo "elastic-testbed: $dir has no testbed.env: not a test bed's folder, left as it is" >&2
  fi
  echo "elastic-testbed: down: no $(ns_of 0), $(ns_of 1) or $bridge left, nor a test bed in $dir"
}

cmd_status() {
  local i ns addr pid link
  echo "test bed in $dir: prefix $prefix, network $net.0/24"
  [ -f "$dir/testbed.env" ] || echo "  $dir: no test bed folder"
  for i in 0 1; do
    ns=$(ns_of "$i")
    addr=$(addr_of "$i")
    if ! ns_exists "$ns"; then echo "  h$i $addr: no namespace $ns"; continue; fi
    pid=$(cat "$dir/sshd-h$i.pid" 2>/dev/null || true)
    link=$(ip -br link show "$(port_of "$i")" 2>/dev/null | awk '{print $2}')
    printf '  h%s %s: namespace %s, sshd %s, cable %s, %s, %s process(es)\n' "$i" "$addr" "$ns" \
      "$([ -n "$pid" ] && running "$pid" && echo "pid $pid" || echo "not running")" \
      "$([ "$link" = DOWN ] && echo cut || echo "${link:-missing}")" \
      "$(grep -qx "$addr" "$dir/hosts" 2>/dev/null && echo listed || echo "not listed")" \
      "$(ip netns pids "$ns" | wc -l)"
  done
  ip -br link show "$bridge" >/dev/null 2>&1 && echo "  bridge $bridge: $net.254/24" ||
    echo "  no bridge $bridge"
}

# Rewrites DIR/hosts with host i in or out, atomically (discovery may read it at any moment).
set_listed() {
  local i=$1 listed=$2 addr
  addr=$(addr_of "$i")
  [ -f "$dir/hosts" ] || die "no $dir/hosts: is the test bed up (\`$0 up $dir\`)?"
  grep -vx "$addr" "$dir/hosts" >"$dir/hosts.new" || true
  if [ "$listed" = 1 ]; then echo "$addr" >>"$dir/hosts.new"; fi
  mv "$dir/hosts.new" "$dir/hosts"
  if [ "$listed" = 1 ]; then
    echo "elastic-testbed: $addr listed in $dir/hosts again: the launcher tries it at once"
  else
    echo "elastic-testbed: $addr dropped from $dir/hosts: the launcher lets its workers go"
  fi
}

set_cable() {
  local i=$1 state=$2
  ip link show "$(port_of "$i")" >/dev/null 2>&1 || die "no link $(port_of "$i"): is the test bed up?"
  ip link set "$(port_of "$i")" "$state"
  echo "elastic-testbed: $(addr_of "$i") $([ "$state" = down ] && echo "cut off: its packets are dropped" || echo "reachable again")"
}

command=${1:-}
[ -n "$command" ] || usage
shift
case "$command" in
  up | down | status) [ $# -le 1 ] || usage; dir=${1:-/tmp/dtrain-testbed} ;;
  drop | add | cut | restore)
    if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
    host=$1
    dir=${2:-/tmp/dtrain-testbed} ;;
  -h | --help) usage ;;
  *) echo "elastic-testbed: unknown command \"$command\"" >&2; usage ;;
esac
[ "$dir" = / ] || dir=${dir%/}
[ -n "$dir" ] || usage
load_names
case "$command" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  drop) i=$(host_index "$host"); set_listed "$i" 0 ;;
  add) i=$(host_index "$host"); set_listed "$i" 1 ;;
  cut) i=$(host_index "$host"); set_cable "$i" down ;;
  restore) i=$(host_index "$host"); set_cable "$i" up ;;
esac
