#!/usr/bin/env bash
# BlockLLM's stitching blocks (§4.4, issue 30): a linear block that carries one model's residual
# stream into a model of another width, trained with both models frozen, one block for every
# stitching point (the point's position is an input). Evaluated on held-out prompts like Table 3:
# the stitched chain's next-token distributions against the tail model's own (cosine, top-token
# agreement, KL).
#
#   bench/stitch.sh        # smollm-135m bf16 (untied head) -> three 768-wide tails
#
# Makes the head with `blend model init --untie-embeddings` and the tails with `blend model derive`:
#   wide      the head widened to WIDTH (`--widen`): the same function, so an exact stitch exists
#             (the ceiling: what the method recovers when the blocks are equivalent);
#   changed   wide with layers CHANGED perturbed (`--full --scale SCALE`): points before them skip
#             only equivalent layers, points after them skip the change;
#   unrelated another random model (seed 2), widened: no stitch can exist (the floor).
# Then `blend zoo stitch --head H --tail T --points POINTS --steps STEPS --json` for each tail: the
# least-squares block and the trained one, each at every point, on PROMPTS lines of this
# repository's docs (prose; even lines train, odd ones test). Prints each run's table; the JSON
# reports land in OUT_DIR.
# Knobs: BLEND, OUT_DIR (build/stitch), PRESET (smollm-135m), WIDTH (768), CHANGED ("14 15"),
# SCALE (0.5), POINTS (4), STEPS (40), PROMPTS (48), THREADS (0: all), TAILS ("wide changed
# unrelated").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BLEND=${BLEND:-$ROOT/build/blend}
OUT_DIR=${OUT_DIR:-$ROOT/build/stitch}
PRESET=${PRESET:-smollm-135m}
WIDTH=${WIDTH:-768}
CHANGED=${CHANGED:-14 15}
SCALE=${SCALE:-0.5}
POINTS=${POINTS:-4}
STEPS=${STEPS:-40}
PROMPTS=${PROMPTS:-48}
THREADS=${THREADS:-0}
TAILS=${TAILS:-wide changed unrelated}
need_blend_and_python

mkdir -p "$OUT_DIR"
head_dir=$OUT_DIR/head
[[ -d $head_dir ]] || "$BLEND" model init --preset "$PRESET" --untie-embeddings --out "$head_dir" >/dev/null
[[ -d $OUT_DIR/wide ]] || "$BLEND" model derive --base "$head_dir" --out "$OUT_DIR/wide" --widen "$WIDTH" --seed 3 >/dev/null
# shellcheck disable=SC2086  # CHANGED is a list of layers
[[ -d $OUT_DIR/changed ]] || "$BLEND" model derive --base "$OUT_DIR/wide" --out "$OUT_DIR/changed" --full --layers $CHANGED --scale "$SCALE" --seed 5 >/dev/null
if [[ ! -d $OUT_DIR/unrelated ]]; then
  "$BLEND" model init --preset "$PRESET" --untie-embeddings --seed 2 --out "$OUT_DIR/other" >/dev/null
  "$BLEND" model derive --base "$OUT_DIR/other" --out "$OUT_DIR/unrelated" --widen "$WIDTH" --seed 4 >/dev/null
fi

# Prose from the docs: paragraphs of 200-600 characters, the first PROMPTS of them.
python3 - "$ROOT" "$PROMPTS" "$OUT_DIR/prompts.txt" <<'PY'
import pathlib, sys
root, n, out = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
lines = []
for doc in ["README.md", "docs/CLI.md", "docs/ARCHITECTURE.md", "docs/BENCHMARKS.md"]:
    for para in (root / doc).read_text().split("\n\n"):
        text = " ".join(para.split())
        if 200 <= len(text) <= 600 and not text.startswith(("|", "```", "#")):
            lines.append(text)
pathlib.Path(out).write_text("\n".join(lines[:n]) + "\n")
PY

echo "machine: $(cpu_model), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
for tail in $TAILS; do
  echo "== tail: $tail"
  start=$(date +%s)
  "$BLEND" zoo stitch --head "$head_dir" --tail "$OUT_DIR/$tail" --points "$POINTS" \
    --steps "$STEPS" --prompts "$OUT_DIR/prompts.txt" --threads "$THREADS" \
    --json "$OUT_DIR/report-$tail.json" --out "$OUT_DIR/stitch-$tail.safetensors"
  echo "   ($(($(date +%s) - start)) s)"
done
