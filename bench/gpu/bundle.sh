#!/usr/bin/env bash
# Packs what the lent GPU machine needs to run blend into OUT_DIR (the repository's git-ignored
# .gpu/, which a device run carries): one xz archive, blend-bundle.tar.xz, holding
#   libexec/      blend and, when built, blend_cuda_tests (BUILD_DIR/tests) and
#                 cuda_forward_bench (BUILD_DIR/bench)
#   lib/          every shared library ldd names for them, except those below
#   lib-gcc/      libstdc++ and libgcc_s (used there only when the machine's own are too old)
#   glibc/        glibc and its loader (used there only when the machine's glibc is too old to
#                 run blend: unpack.sh then starts blend through this loader)
#   tokenizer/    tokenizer.json and tokenizer_config.json (CMake's BLEND_TOKENIZER_DIR)
#   BUILD_INFO    where and from what commit it was built, blend --version, the ldd output
# The CUDA driver (libcuda, libnvidia-*) and the CUDA toolkit's libraries (libcudart, libcublas,
# libcublasLt, ...) are left out: the device has the same CUDA 13.0 toolkit and its own driver.
# Run bench/gpu/unpack.sh OUT_DIR/blend-bundle.tar.xz on the device. Usage:
#   bench/gpu/bundle.sh BUILD_DIR OUT_DIR
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR OUT_DIR" >&2
  exit 2
fi
build="$(cd "$1" && pwd)"
mkdir -p "$2"
out="$(cd "$2" && pwd)"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
[ -x "$build/blend" ] || { echo "bundle: no blend executable in $build" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
b="$stage/blend"
mkdir -p "$b/libexec" "$b/lib" "$b/lib-gcc" "$b/glibc" "$b/tokenizer"

exes=("$build/blend")
[ -x "$build/tests/blend_cuda_tests" ] && exes+=("$build/tests/blend_cuda_tests")
[ -x "$build/bench/cuda_forward_bench" ] && exes+=("$build/bench/cuda_forward_bench")
for exe in "${exes[@]}"; do
  cp "$exe" "$b/libexec/"
  echo "bundle: $(basename "$exe") ($(du -h "$exe" | cut -f1))"
done

# The class of a shared library by its name: where it goes in the bundle, or "skip".
lib_class() {
  case "$1" in
    libcuda.so* | libcudart.so* | libcublas.so* | libcublasLt.so* | libnvidia-* | libnvrtc* | \
      libnvJitLink* | libcufft* | libcurand* | libcusparse* | libcusolver* | libnvToolsExt* | \
      libnvperf* | libcupti*)
      echo skip ;;
    libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libresolv.so* | libutil.so* | \
      libanl.so* | libmvec.so* | ld-linux*)
      echo glibc ;;
    libstdc++.so* | libgcc_s.so*) echo lib-gcc ;;
    *) echo lib ;;
  esac
}

missing=0
declare -A seen=()
for exe in "${exes[@]}"; do
  # Lines: "libx.so.1 => /path/libx.so.1 (0x...)", "libx.so.1 => not found",
  # "/lib64/ld-linux-x86-64.so.2 (0x...)", "linux-vdso.so.1 (0x...)".
  while read -r name arrow path _; do
    if [ "$arrow" != "=>" ]; then
      case "$name" in
        */ld-linux*) path="$name"; name="$(basename "$name")" ;;
        *) continue ;;
      esac
    fi
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    class="$(lib_class "$name")"
    if [ "$class" = skip ]; then
      echo "bundle: left out $name (CUDA driver/toolkit: the device has its own)"
      continue
    fi
    if [ "$path" = "not" ]; then
      echo "bundle: ERROR: $name is not found here (ldd $(basename "$exe"))" >&2
      missing=1
      continue
    fi
    cp -L "$path" "$b/$class/$name"
  done < <(ldd "$exe")
done
[ "$missing" = 0 ] || { echo "bundle: a library is missing; nothing written" >&2; exit 1; }

tokdir="$(sed -n 's/^BLEND_TOKENIZER_DIR:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)"
[ -n "$tokdir" ] || tokdir="$repo/.cache/tokenizer-llama3/package/models"
for f in tokenizer.json tokenizer_config.json; do
  [ -f "$tokdir/$f" ] || { echo "bundle: no $tokdir/$f (run scripts/setup.sh)" >&2; exit 1; }
  cp "$tokdir/$f" "$b/tokenizer/"
done

src="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)"
{
  echo "built_at: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "build_dir: $build"
  echo "source_dir: ${src:-unknown}"
  if [ -n "$src" ] && git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
    echo "commit: $(git -C "$src" rev-parse HEAD)$(git -C "$src" diff --quiet HEAD || echo ' (+ uncommitted changes)')"
    echo "branch: $(git -C "$src" rev-parse --abbrev-ref HEAD)"
  fi
  echo "tokenizer_dir_at_build: $tokdir"
  echo "glibc_at_build: $(ldd --version | head -1)"
  echo "blend_version: $("$build/blend" --version 2>&1 || echo FAILED)"
  for exe in "${exes[@]}"; do
    echo "--- ldd $(basename "$exe")"
    ldd "$exe" || true
  done
} > "$b/BUILD_INFO"

echo "bundle: uncompressed $(du -sh "$b" | cut -f1): libexec $(du -sh "$b/libexec" | cut -f1)," \
  "lib $(du -sh "$b/lib" | cut -f1), lib-gcc $(du -sh "$b/lib-gcc" | cut -f1)," \
  "glibc $(du -sh "$b/glibc" | cut -f1), tokenizer $(du -sh "$b/tokenizer" | cut -f1)"
archive="$out/blend-bundle.tar.xz"
rm -f "$archive" "$archive.tmp"
tar -C "$stage" -cf - blend | xz -9 -T0 > "$archive.tmp"
mv "$archive.tmp" "$archive"
bytes="$(stat -c %s "$archive")"
echo "bundle: wrote $archive: $(awk -v b="$bytes" 'BEGIN { printf "%.1f MiB", b / 1048576 }')"
if [ "$bytes" -gt $((48 * 1048576)) ]; then
  echo "bundle: WARNING: over 48 MiB; a device run carries at most 64 MiB in all" >&2
fi
