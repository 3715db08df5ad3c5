# Sourced by gpu-check.sh and gpu-perf.sh with --prebuilt: the run-time libraries a prebuilt
# bundle needs, from the GPU machine itself. Sets TESSERA_NVRTC_PATH / TESSERA_NCCL_PATH (unless
# given) and LD_LIBRARY_PATH, unpacks the bundle's Vulkan loader where the image has none and
# points it at NVIDIA's ICD. Needs PREBUILT (the bundle folder).

# The file matching GLOB with the newest version in its name, under the CUDA toolkit, the system
# library folders and Python's nvidia packages (on a tie, the first of those).
system_lib() {
  local py; py="$(python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null)"
  # shellcheck disable=SC2086 # the namespace package may span several folders
  find /usr/local/cuda/ /usr/local/cuda-*/ /usr/lib/x86_64-linux-gnu /usr/local/lib $py \
    -name "$1" 2>/dev/null | tac | awk -F/ '{ print $NF "\t" $0 }' | sort -t "$(printf '\t')" -k1,1V -s |
    tail -n 1 | cut -f2
}

# prebuilt_env: exports the variables; prints what it found; returns 1 without NVRTC.
prebuilt_env() {
  local nvrtc nccl icd deb
  nvrtc="${TESSERA_NVRTC_PATH:-$(system_lib 'libnvrtc.so.1[23]')}"
  nccl="${TESSERA_NCCL_PATH:-$(system_lib 'libnccl.so.2')}"
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 ' && ls "$PREBUILT"/debs/*.deb >/dev/null 2>&1; then
    for deb in "$PREBUILT"/debs/*.deb; do dpkg -x "$deb" /; done
    ldconfig
  fi
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$icd" ] && export VK_DRIVER_FILES="$icd"
  [ -n "$nvrtc" ] || return 1
  export TESSERA_NVRTC_PATH="$nvrtc"
  export LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -n "$nccl" ] && export TESSERA_NCCL_PATH="$nccl" LD_LIBRARY_PATH="$(dirname "$nccl"):$LD_LIBRARY_PATH"
  echo "system NVRTC $nvrtc; NCCL ${nccl:-not found (the vendor all-reduce declines)}"
}

# unpack_bundle DIR: the folder to use as PREBUILT. A bundle from scripts/gpu-bundle.sh is
# DIR/bundle.tar.xz (compressed, for the carry); it is unpacked into /tmp/tessera-bundle (outside
# the checkout, which the device copies back and forth). A folder with bin/tessera is used as it is.
unpack_bundle() {
  if [ -f "$1/bundle.tar.xz" ]; then
    rm -rf /tmp/tessera-bundle && mkdir -p /tmp/tessera-bundle &&
      tar -C /tmp/tessera-bundle -xJf "$1/bundle.tar.xz" || return 1
    echo /tmp/tessera-bundle
  else
    (cd "$1" && pwd)
  fi
}

# carry_check PATH...: what a device call carries (this checkout's tracked and untracked,
# not ignored files, plus each PATH, which `carry` names) against CARRY_LIMIT_MIB (default 56 of
# the device tool's 64 MiB, leaving room for the tree to grow). Prints each part; returns 1 over.
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
carry_check() {
  local limit="${CARRY_LIMIT_MIB:-56}" tree total p size
  tree="$(git ls-files -z -co --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)"
  total="$tree"
  printf 'carry: %6s MiB  the working tree (tracked and untracked, not ignored)\n' "$(mib "$tree")"
  for p in "$@"; do
    [ -e "$p" ] || continue
    size="$(du -cb "$p" | tail -n 1 | cut -f1)"
    total=$((total + size))
    printf 'carry: %6s MiB  %s\n' "$(mib "$size")" "$p"
  done
  printf 'carry: %6s MiB  in all, against %d MiB\n' "$(mib "$total")" "$limit"
  [ "$total" -le $((limit * 1048576)) ] || { echo "carry: over $limit MiB: leave something out" >&2; return 1; }
}
