#!/usr/bin/env bash
# Builds wsgemm's wheel, installs it in a fresh venv and smoke-tests the installed copy (issue #27:
# "a wheel that installs in a fresh venv and passes a smoke test"). CI runs it (.ci/run); no GPU and
# no network needed.
#
# - The wheel is built from a copy of the checkout's files (tracked, plus untracked ones git does
#   not ignore), not in place: setuptools' in-place build keeps a build/ folder whose stale files
#   (a module deleted since) would go into the wheel, and the copy has no egg-info or caches.
# - --no-build-isolation: the build uses the installed setuptools (checked against pyproject's
#   build-system.requires below) instead of fetching one, so the build needs no package index.
# - The venv has --system-site-packages so that torch and the CuTe DSL come from this machine, and
#   the wheel goes in with --no-deps --no-index: nothing is downloaded.
# - The checkout may also be installed editable in the system site-packages. Its finder is
#   appended to sys.meta_path after the normal path finder, and the venv's site-packages come
#   before the system's on sys.path, so the venv's copy is found first; the smoke test asserts
#   that rather than trusting it. Every venv python runs with -I (isolated: no PYTHONPATH, no user
#   site, no current directory on sys.path) from an empty directory outside the checkout, so a
#   PYTHONPATH pointing at a checkout cannot win either.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" - "$repo/pyproject.toml" <<'EOF'
import sys, tomllib
from importlib.metadata import version
from packaging.requirements import Requirement
with open(sys.argv[1], "rb") as f:
    requires = tomllib.load(f)["build-system"]["requires"]
for text in requires:
    req = Requirement(text)
    have = version(req.name)
    if not req.specifier.contains(have, prereleases=True):
        sys.exit(f"wheel_smoke: the build needs {text}, this python has {req.name} {have}")
EOF

echo "wheel_smoke: building the wheel"
mkdir "$work/src" "$work/dist" "$work/run"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$repo" && tar -c --null -T -) | tar -x -C "$work/src"
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$work/src"
wheel=("$work"/dist/wsgemm-*.whl)
[[ ${#wheel[@]} -eq 1 && -f ${wheel[0]} ]] || { echo "wheel_smoke: expected one wheel, got: ${wheel[*]}" >&2; exit 1; }
echo "wheel_smoke: built $(basename "${wheel[0]}")"

# Every file of the package in the source tree is in the wheel, and nothing else is.
(cd "$work/src" && find wsgemm -type f -not -path '*/__pycache__/*' | sort) > "$work/src_files"
"$python" - "${wheel[0]}" "$work/src_files" <<'EOF'
import sys, zipfile
in_wheel = {n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith("wsgemm/")}
in_source = set(open(sys.argv[2]).read().split())
missing, extra = sorted(in_source - in_wheel), sorted(in_wheel - in_source)
if missing or extra:
    sys.exit(f"wheel_smoke: the wheel misses {missing} and has extra {extra}")
print(f"wheel_smoke: the wheel holds all {len(in_source)} files under wsgemm/")
EOF

echo "wheel_smoke: installing it in a fresh venv"
"$python" -m venv --system-site-packages "$work/venv"
vpy="$work/venv/bin/python"
"$vpy" -I -m pip install -q --no-deps --no-index "${wheel[0]}"

cd "$work/run"
# inspect compiles into a fresh cache: from the wheel's kernels, not a cache the checkout filled.
export WSGEMM_CACHE_DIR="$work/cache"
"$vpy" -I - "$repo/pyproject.toml" "$work/src" <<'EOF'
import glob, importlib.util, os, sys, sysconfig, tomllib
from importlib import resources

pyproject, src = sys.argv[1], sys.argv[2]
site = os.path.realpath(sysconfig.get_paths()["purelib"])

import wsgemm

where = os.path.realpath(wsgemm.__file__)
if not where.startswith(site + os.sep):
    sys.exit(f"wheel_smoke: imported {where}, not the wheel's copy under {site}")
# `python -m wsgemm` resolves the same way; check its module too.
main = os.path.realpath(importlib.util.find_spec("wsgemm.__main__").origin)
if not main.startswith(site + os.sep):
    sys.exit(f"wheel_smoke: `python -m wsgemm` would run {main}, not the wheel's copy")
print(f"wheel_smoke: import wsgemm -> {where}")

# Every data file pyproject's package-data names (globs expanded in the source tree), read
# through importlib.resources from the installed package.
with open(pyproject, "rb") as f:
    package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]
count = 0
for package, patterns in package_data.items():
    base = os.path.join(src, *package.split("."))
    for pattern in patterns:
        found = sorted(glob.glob(os.path.join(base, pattern)))
        if not found:
            sys.exit(f"wheel_smoke: package-data {package}: {pattern!r} matches no file")
        for path in found:
            rel = os.path.relpath(path, base).split(os.sep)
            data = resources.files(package).joinpath(*rel).read_bytes()
            if data != open(path, "rb").read():
                sys.exit(f"wheel_smoke: {package}/{'/'.join(rel)} differs from the source's")
            count += 1
print(f"wheel_smoke: {count} package-data files read through importlib.resources")
EOF

"$vpy" -I -m wsgemm --help > /dev/null
echo "wheel_smoke: python -m wsgemm --help ok"
"$vpy" -I -m wsgemm inspect --arch sm_80 --backend sm80
echo "wheel_smoke: ok"
