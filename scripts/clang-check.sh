#!/usr/bin/env bash
# Compiles with clang 14, into nothing, the fuzz targets' own files (test/fuzz) and each file of
# the libraries they link (common/, worker/, launcher/) in a built Ninja build of dtrain (default
# build-cpu/) whose code, or a dtrain header it includes, is where gcc and clang part ways:
# OpenMP regions, target attributes, vector intrinsics. CI builds with gcc, scripts/fuzz.sh
# builds all of those with clang; this step of scripts/test.sh finds in a minute the breaks the
# fuzz build would meet (issue 43: AVX-512 values across an OpenMP region). It links and runs
# nothing, and checks neither the other tests nor bench/.
#   scripts/clang-check.sh [BUILD_DIR]       (exit 1 if a file does not compile, 2 on bad use)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-cpu}
compiler=clang++-14
command -v "$compiler" >/dev/null || {
  echo "clang-check.sh: $compiler not found (scripts/setup.sh --tests installs clang-14)" >&2
  exit 2
}
[ -f "$dir/build.ninja" ] || {
  echo "clang-check.sh: $dir/build.ninja not found: a Ninja build directory is needed" >&2
  exit 2
}
compdb=$(mktemp)
deps=$(mktemp)
trap 'rm -f "$compdb" "$deps"' EXIT
ninja -C "$dir" -t compdb >"$compdb"
ninja -C "$dir" -t deps >"$deps"  # the headers of each object, as its last compile found them

python3 - "$compiler" "$compdb" "$deps" "$(nproc)" <<'EOF'
import concurrent.futures, json, os, re, shlex, subprocess, sys

compiler, compdb_path, deps_path, jobs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
root = os.getcwd()
PARTING = re.compile(r"#\s*pragma\s+omp|__attribute__\s*\(\(\s*target\s*\(|<immintrin\.h>")
GCC_ONLY = {"-Wshadow=local"}  # clang has no such option; -Wshadow is not the same check

def ours(path):  # a file of the checkout, not of a build directory or the system
    rel = os.path.relpath(path, root)
    return not rel.startswith("..") and not rel.split(os.sep)[0].startswith("build")

parting = {}
def parts_ways(path):
    if path not in parting:
        try:
            with open(path, errors="replace") as f:
                parting[path] = bool(PARTING.search(f.read()))
        except OSError:
            parting[path] = False
    return parting[path]

# What the fuzz build compiles: the libraries and the fuzz targets (not the other tests, not bench).
FUZZ_BUILD = tuple(os.path.join(root, d) + os.sep for d in ("common", "worker", "launcher",
                                                             "test/fuzz"))
entries = [e for e in json.load(open(compdb_path))
           if e.get("file", "").endswith(".cc") and e["file"].startswith(FUZZ_BUILD)
           and " -c " in " " + e.get("command", "") + " "]
by_output = {e["output"]: e for e in entries}  # ninja names objects as build.ninja does

selected, current = [], None
for line in open(deps_path):
    if line and not line[0].isspace():  # "OBJECT: #deps N, deps mtime T (VALID)"
        current = by_output.get(line.split(": #deps")[0]) if ": #deps" in line else None
        continue
    dep = line.strip()
    if current is None or not dep:
        continue
    path = os.path.realpath(os.path.join(current["directory"], dep))
    if ours(path) and parts_ways(path):
        selected.append(current)
        current = None  # one reason is enough
fuzz_dir = os.path.join(root, "test", "fuzz") + os.sep
selected += [e for e in entries if e["file"].startswith(fuzz_dir)]
selected = list({e["file"]: e for e in reversed(selected)}.values())  # each file once

if not any(e["file"].startswith(os.path.join(root, "worker")) for e in selected):
    sys.exit("clang-check.sh: no compiled file of worker/ has OpenMP regions, target attributes "
             "or intrinsics: is the build complete? (they were not checked)")

def clang_command(entry):
    args = shlex.split(entry["command"])
    start = next(i for i, a in enumerate(args) if re.search(r"(^|/)(c\+\+|g\+\+(-\d+)?)$", a))
    out, skip = [compiler], False
    for a in args[start + 1:]:
        if skip:
            skip = False
        elif a in ("-o", "-MT", "-MF"):
            skip = True
        elif a in ("-MD", "-MMD") or a in GCC_ONLY:
            pass
        else:
            out.append(a)
    return out + ["-o", "/dev/null"]

def compile_one(entry):
    r = subprocess.run(clang_command(entry), cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], r.returncode, r.stdout + r.stderr

failed = 0
with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
    for file, code, output in pool.map(compile_one, selected):
        name = os.path.relpath(file, root)
        print(f"  {'ok    ' if code == 0 else 'FAILED'} {name}")
        if code != 0:
            failed += 1
            print("\n".join("    " + l for l in output.rstrip().splitlines()[:60]))
print(f"clang-check.sh: {len(selected)} files compiled with {compiler}, {failed} failed")
sys.exit(1 if failed else 0)
EOF
