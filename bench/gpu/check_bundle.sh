#!/usr/bin/env bash
# Checks bench/gpu/bundle.sh + unpack.sh here, on the cpu backend: unpacks ARCHIVE into a
# temporary folder once per start-up mode (the machine's libstdc++, the bundled one, the bundled
# glibc's loader), checks that every library blend loads comes from the bundle (or is glibc's,
# except in glibc mode), and runs `model init --preset tiny` and a two-line `blend batch` through
# the wrapper. Usage: bench/gpu/check_bundle.sh [ARCHIVE (default .gpu/blend-bundle.tar.xz)]
set -euo pipefail
archive="$(cd "$(dirname "${1:-.gpu/blend-bundle.tar.xz}")" && pwd)/$(basename "${1:-.gpu/blend-bundle.tar.xz}")"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail=0
for mode in system gcc glibc; do
  dest="$work/$mode/blend"
  echo "=== mode $mode"
  UNPACK_MODES=$mode bash "$here/unpack.sh" "$archive" "$dest" > "$work/$mode.log" 2>&1 ||
    { cat "$work/$mode.log"; echo "check: unpack failed in mode $mode"; fail=1; continue; }
  grep -q "mode $mode: blend --version" "$work/$mode.log"
  # Where each library resolves with the wrapper's search path.
  libs="$(sed -n 's/.*--library-path "\([^"]*\)".*/\1/p; s/^export LD_LIBRARY_PATH="\([^"$]*\).*/\1/p' "$dest/bin/blend")"
  if [ "$mode" = glibc ]; then
    listing="$("$dest/glibc/ld-linux-x86-64.so.2" --list --library-path "$libs" "$dest/libexec/blend")"
  else
    listing="$(LD_LIBRARY_PATH="$libs" ldd "$dest/libexec/blend")"
  fi
  outside="$(echo "$listing" | grep '=>' | grep -v "=> $dest/" |
    grep -Ev '^\s*(libc|libm|libpthread|libdl|librt)\.so' || true)"
  if [ "$mode" = glibc ]; then outside="$(echo "$listing" | grep '=>' | grep -v "=> $dest/" || true)"; fi
  if [ "$mode" = system ]; then outside="$(echo "$outside" | grep -Ev '^\s*(libstdc\+\+|libgcc_s)\.so' || true)"; fi
  # The CUDA toolkit's libraries stay outside on purpose (bundle.sh): the device has its own.
  outside="$(echo "$outside" | grep -Ev '=> /usr/local/cuda[^ ]*/lib(64)?/' || true)"
  if [ -n "$outside" ]; then
    echo "check: mode $mode: libraries from outside the bundle:"; echo "$outside"; fail=1
  else
    case $mode in
      system) echo "check: mode system: every library but glibc's, libstdc++ and libgcc_s from the bundle" ;;
      gcc) echo "check: mode gcc: every library but glibc's from the bundle" ;;
      glibc) echo "check: mode glibc: every library, glibc's and the loader too, from the bundle" ;;
    esac
  fi
  "$dest/bin/blend" model init --preset tiny --out "$work/$mode/tiny"
  cat > "$work/$mode/in.jsonl" <<'JSONL'
{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "tiny", "prompt": [128000, 9906, 11, 856], "max_tokens": 8, "temperature": 0, "logprobs": 1, "return_tokens_as_token_ids": true}}
{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}}
JSONL
  "$dest/bin/blend" batch --model "$work/$mode/tiny" --input "$work/$mode/in.jsonl" \
    --output "$work/$mode/out.jsonl" --backend cpu --quiet
  n="$(grep -c '"status_code":200' "$work/$mode/out.jsonl" || true)"
  [ "$n" = 2 ] || { echo "check: mode $mode: $n of 2 results"; cat "$work/$mode/out.jsonl"; fail=1; }
  echo "check: mode $mode: init + batch ran, $n results; first: $(head -c 300 "$work/$mode/out.jsonl")"
done
if [ "$fail" != 0 ]; then
  echo "check: FAILED"
  exit 1
fi
echo "check: all modes pass"
