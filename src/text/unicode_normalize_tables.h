// Internal to unicode_normalize.cc: the tables scripts/gen_unicode_norm.py generates (their
// layout is documented there).
#pragma once

#include <cstddef>
#include <cstdint>

namespace blend::tok::unicode_tables {

constexpr uint32_t kBlockShift = 7;  // 128 code points per second-stage block
// Property bits above the canonical combining class (bits 0-7).
constexpr uint16_t kNfdNo = 1 << 8;        // has a canonical decomposition
constexpr uint16_t kNfkdNo = 1 << 9;       // has a canonical or compatibility decomposition
constexpr uint16_t kNfcNotYes = 1 << 10;   // NFC_QC is No or Maybe
constexpr uint16_t kNfkcNotYes = 1 << 11;  // NFKC_QC is No or Maybe

struct Decomposition {
  uint32_t cp;
  uint16_t offset;  // into kDecompositionPool
  uint16_t length;
};
struct Composition {
  uint64_t pair;  // first << 21 | second
  uint32_t composite;
};

extern const uint16_t kPropStage1[];
extern const uint16_t kPropStage2[];
extern const uint32_t kDecompositionPool[];
extern const Decomposition kCanonical[];
extern const size_t kCanonicalCount;
extern const Decomposition kCompatibility[];
extern const size_t kCompatibilityCount;
extern const Composition kCompositions[];
extern const size_t kCompositionCount;

}  // namespace blend::tok::unicode_tables
