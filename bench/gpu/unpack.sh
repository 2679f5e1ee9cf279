#!/usr/bin/env bash
# Runs on the GPU machine: unpacks the archive bench/gpu/bundle.sh wrote into DEST (default
# /tmp/blend) and makes blend runnable there whatever that machine's libraries:
#   DEST/bin/blend (and DEST/bin/blend_cuda_tests when bundled): wrappers that set
#     LD_LIBRARY_PATH (the bundled libraries, /usr/local/cuda's, any pip nvidia/*/lib holding
#     cuBLAS or the CUDA runtime) and BLEND_TOKENIZER_DIR (the bundled tokenizer) and start the
#     real executable in DEST/libexec
#   DEST/env.sh: BLEND (the wrapper), PATH and BLEND_TOKENIZER_DIR, for `. DEST/env.sh`
# It tries, in order, until `blend --version` runs: the machine's libstdc++/libgcc_s, the
# bundled ones (lib-gcc/), then the bundled glibc's loader (glibc/; for a machine whose glibc is
# older than the build machine's). Every attempt prints what it does; a failure prints ldd.
# Exit status 0 when blend runs. UNPACK_MODES="glibc" (say) tries only those modes (a test).
# Usage:
#   bash bench/gpu/unpack.sh [ARCHIVE (default .gpu/blend-bundle.tar.xz)] [DEST (default /tmp/blend)]
archive="${1:-.gpu/blend-bundle.tar.xz}"
dest="${2:-/tmp/blend}"
say() { echo "unpack: $*"; }

if [ ! -f "$archive" ]; then
  say "ERROR: no archive $archive (run bench/gpu/bundle.sh BUILD_DIR .gpu here first)"
  exit 1
fi
parent="$(dirname "$dest")"
mkdir -p "$parent" || exit 1
rm -rf "$dest" "$parent/blend.unpack.$$"
tmp="$parent/blend.unpack.$$"
mkdir -p "$tmp"
say "extracting $archive ($(du -h "$archive" | cut -f1)) into $dest"
if command -v xz >/dev/null 2>&1 && tar -C "$tmp" -xJf "$archive"; then
  :
else
  say "tar -xJf failed or no xz; extracting with python3's tarfile"
  rm -rf "$tmp" && mkdir -p "$tmp"
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$archive" "$tmp" || { say "ERROR: cannot extract $archive"; exit 1; }
fi
mv "$tmp/blend" "$dest" && rmdir "$tmp"
dest="$(cd "$dest" && pwd)"
sed -n '1,9p' "$dest/BUILD_INFO" | sed 's/^/unpack: build: /'

# shellcheck disable=SC1091
say "machine: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version 2>/dev/null | head -1)"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    sed 's/^/unpack: gpu: /'
else
  say "no nvidia-smi"
fi

# CUDA's libraries: the toolkit's, then any pip wheel's (torch's nvidia-* packages).
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && cuda_dirs="$cuda_dirs:$d"
done
pip_dirs="$(python3 - <<'PY' 2>/dev/null
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")
seen = []
for root in (spec.submodule_search_locations if spec else []):
    for d in sorted(glob.glob(os.path.join(root, "*", "lib")) + glob.glob(os.path.join(root, "*", "*", "lib"))):
        if (glob.glob(os.path.join(d, "libcublas*")) or glob.glob(os.path.join(d, "libcudart*"))) and d not in seen:
            seen.append(d)
print(":".join(seen))
PY
)"
[ -n "$pip_dirs" ] && cuda_dirs="$cuda_dirs:$pip_dirs"
cuda_dirs="${cuda_dirs#:}"
say "CUDA library dirs: ${cuda_dirs:-none found}"

real="$dest/libexec/blend"
tok="$dest/tokenizer"
try() {  # try MODE LIBPATH: does blend --version run?
  local mode="$1" libs="$2" out
  if [ "$mode" = glibc ]; then
    out="$(GOMP_SPINCOUNT=1000 "$dest/glibc/ld-linux-x86-64.so.2" --library-path "$libs" "$real" --version 2>&1)"
  else
    out="$(LD_LIBRARY_PATH="$libs" "$real" --version 2>&1)"
  fi
  local rc=$?
  if [ $rc = 0 ]; then
    say "mode $mode: blend --version: $out"
    return 0
  fi
  say "mode $mode: blend --version failed (exit $rc): $out"
  if [ "$mode" != glibc ]; then
    say "ldd with LD_LIBRARY_PATH=$libs:"
    LD_LIBRARY_PATH="$libs" ldd "$real" 2>&1 | sed 's/^/unpack:   /'
  fi
  return 1
}

mode=""
for m in ${UNPACK_MODES:-system gcc glibc}; do
  case $m in
    system) libs="$dest/lib" ;;
    gcc) libs="$dest/lib:$dest/lib-gcc" ;;
    glibc) libs="$dest/glibc:$dest/lib:$dest/lib-gcc" ;;
  esac
  [ -n "$cuda_dirs" ] && libs="$libs:$cuda_dirs"
  if try "$m" "$libs"; then
    mode=$m
    break
  fi
done
status=0
if [ -z "$mode" ]; then
  say "ERROR: blend does not start in any mode; wrappers written for mode system anyway"
  mode=system
  libs="$dest/lib"
  [ -n "$cuda_dirs" ] && libs="$libs:$cuda_dirs"
  status=1
fi

mkdir -p "$dest/bin"
for exe in "$dest"/libexec/*; do
  name="$(basename "$exe")"
  {
    echo '#!/bin/sh'
    echo "# written by bench/gpu/unpack.sh (mode $mode)"
    echo "export BLEND_TOKENIZER_DIR=\"\${BLEND_TOKENIZER_DIR:-$tok}\""
    if [ "$mode" = glibc ]; then
      # The loader is /proc/self/exe here: GOMP_SPINCOUNT set keeps blend from re-executing it.
      echo "export GOMP_SPINCOUNT=\"\${GOMP_SPINCOUNT:-1000}\""
      echo "exec \"$dest/glibc/ld-linux-x86-64.so.2\" --library-path \"$libs\" \"$exe\" \"\$@\""
    else
      echo "export LD_LIBRARY_PATH=\"$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
      echo "exec \"$exe\" \"\$@\""
    fi
  } > "$dest/bin/$name"
  chmod +x "$dest/bin/$name"
  say "wrote $dest/bin/$name"
done
# No LD_LIBRARY_PATH here: the wrappers set it for blend alone, so python3 and torch in the
# same shell keep the machine's own libraries.
{
  echo "export BLEND_TOKENIZER_DIR=\"$tok\""
  echo "export BLEND=\"$dest/bin/blend\""
  echo "export PATH=\"$dest/bin:\$PATH\""
} > "$dest/env.sh"
say "wrote $dest/env.sh (. it for BLEND, PATH, BLEND_TOKENIZER_DIR)"

# Tests built there look for the tokenizer at the build machine's path: give them one when that
# path is free to create (never overwriting anything).
tok_build="$(sed -n 's/^tokenizer_dir_at_build: //p' "$dest/BUILD_INFO")"
if [ -n "$tok_build" ] && [ ! -e "$tok_build" ]; then
  if mkdir -p "$tok_build" 2>/dev/null && cp "$tok"/* "$tok_build"/ 2>/dev/null; then
    say "copied the tokenizer to $tok_build (the path the bundled tests were built with)"
  else
    say "could not create $tok_build (tests that read the tokenizer from there will fail)"
  fi
fi
exit $status
