#!/usr/bin/env bash
# The GPU host's bundle in the three parts scripts/gpu_session.sh expects, each small enough to
# travel beside the working tree (64 MiB a transfer): ../shared/gpu/make-bundle.sh makes p1 (the
# large wheel's first half) and p2 (its second half, the small wheels, install.sh); p2 and the
# tree together are over the limit, so the small wheels move to pw, with a stash.sh that keeps
# them on the host, and p2's install.sh reads them there; so does p1 and the tree once the tree
# passes ~17 MB, so p1's part keeps its first P1_MIB MiB (36) and the rest travels in pw too
# (big.part.00b, stashed beside part 00; install.sh joins the three).
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
keep=$(( ${P1_MIB:-36} * 1024 * 1024 ))
head -c $keep "$DIR/p1/big.part.00" > "$DIR/p1/big.part.00.head"
tail -c +$(( keep + 1 )) "$DIR/p1/big.part.00" > "$DIR/pw/big.part.00b"
mv "$DIR/p1/big.part.00.head" "$DIR/p1/big.part.00"
cat > "$DIR/pw/stash.sh" <<'EOF'
#!/usr/bin/env bash
# GPU host: keep the small wheels outside the working tree (p2's install.sh reads them there).
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$HOME/.cache/gpu-bundle/wheels"
cp "$src"/wheels/*.whl "$HOME/.cache/gpu-bundle/wheels/"
cp "$src"/big.part.00b "$HOME/.cache/gpu-bundle/"
ls "$HOME/.cache/gpu-bundle/wheels"
EOF
chmod u+w "$DIR/p2/install.sh"
sed -i 's#"\$_gpu_src"/wheels/\*\.whl#"$_gpu_keep"/wheels/*.whl#' "$DIR/p2/install.sh"
sed -i 's#cat "\$_gpu_keep/big.part.00" #cat "$_gpu_keep/big.part.00" "$_gpu_keep/big.part.00b" #' \
    "$DIR/p2/install.sh"
grep -q '_gpu_keep"/wheels' "$DIR/p2/install.sh" && grep -q 'big.part.00b' "$DIR/p2/install.sh" || {
    echo "make_gpu_bundle: install.sh no longer reads its wheels where this script expects" >&2
    exit 1
}
du -sh "$DIR"/p1 "$DIR"/pw "$DIR"/p2
