#!/usr/bin/env bash
# CTest test_install: installs the build into a temp prefix (`cmake --install BUILD --prefix`, as
# scripts/install.sh does into /usr/local) and runs the installed programs by name, with PATH
# holding the prefix's bin/ and the system's directories only: `dtrain --version`, a /bin/true
# job, and a tiny training job, which only works if the installed dtrain finds the installed
# dtrain-worker beside it. It does not touch /usr/local.
#   install_check.sh CMAKE BUILD_DIR SOURCE_DIR
set -euo pipefail
cmake=$1 build=$(cd "$2" && pwd) source=$(cd "$3" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-install-check-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test_install: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "cmake --install $build --prefix $tmp/prefix failed"; }
for program in dtrain dtrain-worker; do
  [ -x "$tmp/prefix/bin/$program" ] || fail "$program was not installed into $tmp/prefix/bin"
done
[ -f "$tmp/prefix/share/bash-completion/completions/dtrain" ] || fail "no bash completion installed"

export PATH="$tmp/prefix/bin:/usr/bin:/bin"
export HOME="$tmp"
[ "$(command -v dtrain)" = "$tmp/prefix/bin/dtrain" ] || fail "dtrain is not found on PATH"
version=$(dtrain --version) || fail "dtrain --version failed"
echo "dtrain --version: $version"
[[ $version == *[0-9].[0-9]* ]] || fail "dtrain --version printed no version: $version"

mkdir "$tmp/job" && cd "$tmp/job"
echo '{"job": "t", "workers": 2, "command": ["/bin/true"]}' >true.json
dtrain launch true.json >"$tmp/true.log" 2>&1 || { cat "$tmp/true.log" >&2; fail "launch true.json failed"; }

# No "command": the workers are dtrain-worker, found beside the installed dtrain.
cp "$source/configs/tiny-synthetic.json" tiny.json
dtrain launch tiny.json >"$tmp/tiny.log" 2>&1 || { cat "$tmp/tiny.log" >&2; fail "launch tiny.json failed"; }
[ -f runs/tiny-synthetic/model/model.safetensors ] || { cat "$tmp/tiny.log" >&2; fail "no model written"; }
echo "test_install: installed dtrain and dtrain-worker ran a job from $tmp/prefix/bin"
