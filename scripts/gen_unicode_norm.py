#!/usr/bin/env python3
"""Generates the Unicode normalization tables of src/text/unicode_normalize.cc.

Run by CMake at build time (never edited by hand) from the Unicode Character Database that the
Debian package `unicode-data` installs in /usr/share/unicode:

  gen_unicode_norm.py UCD_DIR OUT.cc

Reads UnicodeData.txt (combining classes, decompositions), CompositionExclusions.txt (the
script-specific and post-composition-version exclusions) and DerivedNormalizationProps.txt
(the NFC/NFKC quick-check properties). Writes:
  - a two-stage table of per-code-point properties: the canonical combining class and four
    quick-check bits (see unicode_normalize.cc for their meaning);
  - the full (already recursive) canonical and compatibility decompositions, sorted by code point;
  - the primary composites (pairs whose canonical decomposition they are, minus the exclusions),
    sorted by pair.
Hangul syllables are algorithmic and not in the tables.
"""
import os
import sys

BLOCK = 128  # code points per second-stage block
NUM_CPS = 0x110000

# Property bits above the combining class (low 8 bits).
NFD_NO = 1 << 8  # has a canonical decomposition
NFKD_NO = 1 << 9  # has a canonical or compatibility decomposition
NFC_NOT_YES = 1 << 10  # NFC_QC is No or Maybe
NFKC_NOT_YES = 1 << 11  # NFKC_QC is No or Maybe


def data_lines(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                yield [field.strip() for field in line.split(";")]


def code_range(field):
    if ".." in field:
        lo, hi = field.split("..")
        return range(int(lo, 16), int(hi, 16) + 1)
    return range(int(field, 16), int(field, 16) + 1)


def main():
    ucd, out_path = sys.argv[1], sys.argv[2]
    ccc = {}
    decomp = {}  # cp -> (is_compat, [cps]) single level
    for f in data_lines(os.path.join(ucd, "UnicodeData.txt")):
        cp = int(f[0], 16)
        if int(f[3]):
            ccc[cp] = int(f[3])
        if f[5]:
            parts = f[5].split()
            compat = parts[0].startswith("<")
            if compat:
                parts = parts[1:]
            decomp[cp] = (compat, [int(p, 16) for p in parts])

    exclusions = set()
    for f in data_lines(os.path.join(ucd, "CompositionExclusions.txt")):
        exclusions.update(code_range(f[0]))

    quick = {}
    for f in data_lines(os.path.join(ucd, "DerivedNormalizationProps.txt")):
        if len(f) >= 3 and f[1] in ("NFC_QC", "NFKC_QC") and f[2] in ("N", "M"):
            bit = NFC_NOT_YES if f[1] == "NFC_QC" else NFKC_NOT_YES
            for cp in code_range(f[0]):
                quick[cp] = quick.get(cp, 0) | bit

    def full(cp, compat):
        d = decomp.get(cp)
        if d is None or (d[0] and not compat):
            return [cp]
        out = []
        for c in d[1]:
            out.extend(full(c, compat))
        return out

    canon = {cp: full(cp, False) for cp, d in decomp.items() if not d[0]}
    compat = {cp: full(cp, True) for cp in decomp}

    # Primary composites: canonical pair decompositions of characters that are not excluded
    # (explicitly, as singletons, or as non-starter decompositions).
    compose = {}
    for cp, (is_compat, parts) in decomp.items():
        if is_compat or len(parts) != 2 or cp in exclusions:
            continue
        if ccc.get(cp, 0) != 0 or ccc.get(parts[0], 0) != 0:
            continue  # non-starter decomposition
        compose[(parts[0], parts[1])] = cp

    props = [0] * NUM_CPS
    for cp in range(NUM_CPS):
        p = ccc.get(cp, 0) | quick.get(cp, 0)
        if cp in canon:
            p |= NFD_NO
        if cp in compat:
            p |= NFKD_NO
        props[cp] = p
    # Hangul syllables decompose algorithmically (and are NFC/NFKC quick-check Yes).
    for cp in range(0xAC00, 0xAC00 + 11172):
        props[cp] |= NFD_NO | NFKD_NO

    blocks, stage1, index = [], [], {}
    for start in range(0, NUM_CPS, BLOCK):
        block = tuple(props[start:start + BLOCK])
        if block not in index:
            index[block] = len(blocks)
            blocks.append(block)
        stage1.append(index[block])

    pool = []
    pool_index = {}

    def intern(seq):
        key = tuple(seq)
        if key not in pool_index:
            pool_index[key] = len(pool)
            pool.extend(seq)
        return pool_index[key]

    def decomposition_rows(table):
        rows = []
        for cp in sorted(table):
            seq = table[cp]
            rows.append("{0x%X, %d, %d}" % (cp, intern(seq), len(seq)))
        return rows

    canon_rows = decomposition_rows(canon)
    compat_rows = decomposition_rows(compat)
    compose_rows = ["{0x%XULL, 0x%X}" % ((a << 21) | b, c) for (a, b), c in sorted(compose.items())]

    def join(items, per_line=12):
        lines = []
        for i in range(0, len(items), per_line):
            lines.append("    " + ", ".join(str(x) for x in items[i:i + per_line]) + ",")
        return "\n".join(lines)

    with open(out_path, "w", encoding="utf-8") as out:
        out.write("// Generated by scripts/gen_unicode_norm.py from the Unicode Character Database\n")
        out.write("// (Debian package unicode-data). Do not edit.\n")
        out.write('#include "text/unicode_normalize_tables.h"\n\n')
        out.write("namespace blend::tok::unicode_tables {\n\n")
        out.write("const uint16_t kPropStage1[%d] = {\n%s\n};\n" % (len(stage1), join(stage1, 16)))
        flat = [v for b in blocks for v in b]
        out.write("const uint16_t kPropStage2[%d] = {\n%s\n};\n" % (len(flat), join(flat, 16)))
        out.write("const uint32_t kDecompositionPool[%d] = {\n%s\n};\n" % (len(pool), join(pool)))
        out.write("const Decomposition kCanonical[%d] = {\n%s\n};\n" %
                  (len(canon_rows), join(canon_rows, 6)))
        out.write("const size_t kCanonicalCount = %d;\n" % len(canon_rows))
        out.write("const Decomposition kCompatibility[%d] = {\n%s\n};\n" %
                  (len(compat_rows), join(compat_rows, 6)))
        out.write("const size_t kCompatibilityCount = %d;\n" % len(compat_rows))
        out.write("const Composition kCompositions[%d] = {\n%s\n};\n" %
                  (len(compose_rows), join(compose_rows, 4)))
        out.write("const size_t kCompositionCount = %d;\n\n" % len(compose_rows))
        out.write("}  // namespace blend::tok::unicode_tables\n")


if __name__ == "__main__":
    main()
