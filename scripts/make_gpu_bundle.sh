#!/usr/bin/env bash
# The GPU host's bundle in the three parts scripts/gpu_session.sh expects, each small enough to
# travel beside the working tree (64 MiB a transfer): ../shared/gpu/make-bundle.sh makes p1 (the
# large wheel's first half) and p2 (its second half, the small wheels, install.sh); p2 and the
# tree together are over the limit, so the small wheels move to pw, with a stash.sh that keeps
# them on the host, and p2's install.sh reads them there.
#   usage: bash scripts/make_gpu_bundle.sh [DIR]      (default .gpu; git ignores /.gpu/)
# On the host, one call each: `bash .gpu/p1/stash.sh` (carry .gpu/p1), `bash .gpu/pw/stash.sh`
# (carry .gpu/pw), then `source .gpu/p2/install.sh` (carry .gpu/p2) and the session's commands.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu}
bash ../shared/gpu/make-bundle.sh "$DIR"
rm -rf "$DIR/pw"
mkdir -p "$DIR/pw"
mv "$DIR/p2/wheels" "$DIR/pw/"
cat > "$DIR/pw/stash.sh" <<'EOF'
#!/usr/bin/env bash
# GPU host: keep the small wheels outside the working tree (p2's install.sh reads them there).
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$HOME/.cache/gpu-bundle/wheels"
cp "$src"/wheels/*.whl "$HOME/.cache/gpu-bundle/wheels/"
ls "$HOME/.cache/gpu-bundle/wheels"
EOF
chmod u+w "$DIR/p2/install.sh"
sed -i 's#"\$_gpu_src"/wheels/\*\.whl#"$_gpu_keep"/wheels/*.whl#' "$DIR/p2/install.sh"
grep -q '_gpu_keep"/wheels' "$DIR/p2/install.sh" || {
    echo "make_gpu_bundle: install.sh no longer reads its wheels where this script expects" >&2
    exit 1
}
du -sh "$DIR"/p1 "$DIR"/pw "$DIR"/p2
