#!/usr/bin/env bash
# Compiles every GLSL compute shader kernels/vulkan/*.comp to kernels/vulkan/spv/<name>.spv with
# glslc (--target-env=vulkan1.2 -O, no debug info, so the output is deterministic: the same
# source and glslc give the same bytes). The SPIR-V is committed; the Vulkan backend embeds it.
#
#   scripts/vulkan-shaders.sh           rebuild kernels/vulkan/spv/*.spv
#   scripts/vulkan-shaders.sh --check   recompile into a temporary folder and fail when a committed
#                                       .spv differs from it or is missing, or a .spv has no source
#
# GLSLC names the compiler (default: glslc on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=kernels/vulkan
OUT=$SRC/spv
GLSLC=${GLSLC:-glslc}
check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
command -v "$GLSLC" >/dev/null || { echo "$0: $GLSLC not found (apt-get install glslc)" >&2; exit 1; }

shopt -s nullglob
sources=("$SRC"/*.comp)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

compile() { # source, output
  "$GLSLC" --target-env=vulkan1.2 -O -fshader-stage=compute -I "$SRC" "$1" -o "$2"
}

if [ "$check" = 0 ]; then
  mkdir -p "$OUT"
  for s in "${sources[@]}"; do
    name=$(basename "$s" .comp)
    compile "$s" "$tmp/$name.spv"
    if ! cmp -s "$tmp/$name.spv" "$OUT/$name.spv" 2>/dev/null; then
      cp "$tmp/$name.spv" "$OUT/$name.spv"
      echo "built $OUT/$name.spv"
    fi
  done
  echo "${#sources[@]} shader(s) up to date in $OUT"
  exit 0
fi

bad=0
for s in "${sources[@]}"; do
  name=$(basename "$s" .comp)
  compile "$s" "$tmp/$name.spv"
  if [ ! -f "$OUT/$name.spv" ]; then
    echo "missing: $OUT/$name.spv (run scripts/vulkan-shaders.sh)" >&2; bad=1
  elif ! cmp -s "$tmp/$name.spv" "$OUT/$name.spv"; then
    echo "stale: $OUT/$name.spv differs from $s compiled by $("$GLSLC" --version | head -1)" >&2; bad=1
  fi
done
for spv in "$OUT"/*.spv; do
  name=$(basename "$spv" .spv)
  [ -f "$SRC/$name.comp" ] || { echo "orphan: $spv has no $SRC/$name.comp" >&2; bad=1; }
done
[ "$bad" = 0 ] && echo "${#sources[@]} committed shader(s) match their sources"
exit "$bad"
