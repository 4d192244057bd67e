#!/usr/bin/env bash
# The GPU host's bundle in the three parts scripts/gpu_session.sh expects, each small enough to
# travel beside the working tree (64 MiB a transfer): ../shared/gpu/make-bundle.sh makes p1 (the
# large wheel's first half) and p2 (its second half, the small wheels, install.sh); p2 and the
# tree together are over the limit, so the small wheels move to pw, with a stash.sh that keeps
# them on the host, and p2's install.sh reads them there. The tree grows (its records), so each
# half of the large wheel also keeps only its first P1_MIB / P2_MIB MiB (36 / 32) and sends its
# rest in pw (big.part.00b, big.part.01b, stashed beside part 00): p1, pw and p2 each travel
# beside a tree of up to ~25 MiB. install.sh joins the four pieces in order.
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
# split_tail PART MIB: PART keeps its first MIB MiB; the rest goes to pw as PARTb
split_tail() {
  local part=$1 keep=$(( $2 * 1024 * 1024 ))
  head -c $keep "$part" > "$part.head"
  tail -c +$(( keep + 1 )) "$part" > "$DIR/pw/$(basename "$part")b"
  mv "$part.head" "$part"
}
split_tail "$DIR/p1/big.part.00" ${P1_MIB:-36}
split_tail "$DIR/p2/big.part.01" ${P2_MIB:-32}
cat > "$DIR/pw/stash.sh" <<'EOF'
#!/usr/bin/env bash
# GPU host: keep the small wheels and the large wheel's two tail pieces outside the working
# tree (p2's install.sh reads them there).
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$HOME/.cache/gpu-bundle/wheels"
cp "$src"/wheels/*.whl "$HOME/.cache/gpu-bundle/wheels/"
cp "$src"/big.part.00b "$src"/big.part.01b "$HOME/.cache/gpu-bundle/"
ls "$HOME/.cache/gpu-bundle/wheels"
EOF
chmod u+w "$DIR/p2/install.sh"
sed -i 's#"\$_gpu_src"/wheels/\*\.whl#"$_gpu_keep"/wheels/*.whl#' "$DIR/p2/install.sh"
sed -i -e 's#cat "\$_gpu_keep/big.part.00" "\$_gpu_src/big.part.01"#cat "$_gpu_keep/big.part.00" "$_gpu_keep/big.part.00b" "$_gpu_src/big.part.01" "$_gpu_keep/big.part.01b"#' \
    -e 's#if \[ ! -f "\$_gpu_keep/big.part.00" \]; then#if [ ! -f "$_gpu_keep/big.part.00" ] || [ ! -f "$_gpu_keep/big.part.01b" ]; then#' \
    -e 's#run stash.sh from p1 first#run p1/stash.sh and pw/stash.sh first#' "$DIR/p2/install.sh"
grep -q '_gpu_keep"/wheels' "$DIR/p2/install.sh" && grep -q 'big.part.01b" >' "$DIR/p2/install.sh" \
  && grep -q 'big.part.01b" \]' "$DIR/p2/install.sh" || {
    echo "make_gpu_bundle: install.sh no longer reads its wheels where this script expects" >&2
    exit 1
}
du -sh "$DIR"/p1 "$DIR"/pw "$DIR"/p2
