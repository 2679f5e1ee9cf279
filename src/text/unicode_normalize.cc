#include "text/unicode_normalize.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "text/unicode_normalize_tables.h"
#include "text/utf8.h"

namespace blend::tok {
namespace {

namespace ut = unicode_tables;

// An ill-formed input byte, kept through normalization: above every code point, class 0, never
// decomposed or composed.
constexpr uint32_t kRawByte = 0x80000000u;

// Hangul (Unicode §3.12).
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint16_t props(uint32_t cp) {
  if (cp >= 0x110000) return 0;
  const uint32_t block = ut::kPropStage1[cp >> ut::kBlockShift];
  return ut::kPropStage2[(block << ut::kBlockShift) | (cp & ((1u << ut::kBlockShift) - 1))];
}
uint8_t combining_class(uint32_t cp) {
  return static_cast<uint8_t>(props(cp) & 0xFF);
}

bool composes(NormalForm form) {
  return form == NormalForm::kNFC || form == NormalForm::kNFKC;
}
bool compatibility(NormalForm form) {
  return form == NormalForm::kNFKC || form == NormalForm::kNFKD;
}
uint16_t not_yes_bit(NormalForm form) {
  switch (form) {
    case NormalForm::kNFC:
      return ut::kNfcNotYes;
    case NormalForm::kNFD:
      return ut::kNfdNo;
    case NormalForm::kNFKC:
      return ut::kNfkcNotYes;
    case NormalForm::kNFKD:
      return ut::kNfkdNo;
  }
  return 0;
}

// Appends the full decomposition of cp (itself when it has none).
void decompose(uint32_t cp, bool compat, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const uint16_t p = props(cp);
  if (!(p & (compat ? ut::kNfkdNo : ut::kNfdNo))) {
    out.push_back(cp);
    return;
  }
  const std::span<const ut::Decomposition> table =
      compat ? std::span(ut::kCompatibility, ut::kCompatibilityCount)
             : std::span(ut::kCanonical, ut::kCanonicalCount);
  const auto it = std::lower_bound(table.begin(), table.end(), cp,
                                   [](const ut::Decomposition& d, uint32_t c) { return d.cp < c; });
  if (it == table.end() || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  out.insert(out.end(), ut::kDecompositionPool + it->offset,
             ut::kDecompositionPool + it->offset + it->length);
}

// The primary composite of (a, b), or 0.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  if (a >= 0x110000 || b >= 0x110000) return 0;
  const uint64_t key = (uint64_t{a} << 21) | b;
  const std::span<const ut::Composition> table(ut::kCompositions, ut::kCompositionCount);
  const auto it = std::lower_bound(table.begin(), table.end(), key,
                                   [](const ut::Composition& c, uint64_t k) { return c.pair < k; });
  return it != table.end() && it->pair == key ? it->composite : 0;
}

// Canonical ordering: each run of non-starters sorted by class, stably.
void reorder(std::vector<uint32_t>& cps) {
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(
        cps.begin() + static_cast<ptrdiff_t>(i), cps.begin() + static_cast<ptrdiff_t>(j),
        [](uint32_t x, uint32_t y) { return combining_class(x) < combining_class(y); });
    i = j;
  }
}

// Canonical composition (UAX #15 §X4's sample algorithm), in place.
void compose(std::vector<uint32_t>& cps) {
  if (cps.empty()) return;
  size_t starter = 0, kept = 1;
  int last_class = combining_class(cps[0]) ? 256 : 0;  // a leading non-starter blocks
  for (size_t i = 1; i < cps.size(); ++i) {
    const uint32_t cp = cps[i];
    const int cls = combining_class(cp);
    // Not blocked: nothing since the starter, or only characters of a lower class.
    if (last_class < cls || last_class == 0) {
      if (const uint32_t composite = compose_pair(cps[starter], cp)) {
        cps[starter] = composite;
        continue;
      }
    }
    if (cls == 0) starter = kept;
    last_class = cls;
    cps[kept++] = cp;
  }
  cps.resize(kept);
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp & kRawByte) {
    out.push_back(static_cast<char>(cp & 0xFF));
  } else if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The quick-check of one character (UAX #15 §9, Maybe taken as No), decoded without
// validation: an ill-formed sequence reads as some code point and either passes (normalize()
// keeps its bytes as they are too) or sends its segment to normalize_segment(). A lead byte
// without its continuation bytes is taken alone.
class QuickCheck {
 public:
  explicit QuickCheck(NormalForm form)
      : bit_(not_yes_bit(form)),
        // Below U+0300 every character is a starter that NFC keeps; the others change from
        // U+00C0 (NFD: the first canonical decomposition) or U+00A0 (NFKC, NFKD: the first
        // compatibility one).
        first_checked_(form == NormalForm::kNFC   ? 0x300
                       : form == NormalForm::kNFD ? 0xC0
                                                  : 0xA0) {}

  struct Verdict {
    size_t length = 1;  // bytes of the character
    uint8_t cls = 0;    // its canonical combining class
    bool yes = true;    // its quick-check property is Yes
  };

  Verdict at(std::string_view text, size_t i) const {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + i;
    const unsigned char b = *p;
    if (b < 0x80) return {};
    size_t n = b >= 0xF8 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
    if (text.size() - i < n) n = 1;
    uint32_t cp = n == 1 ? 0 : b & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      if ((p[k] & 0xC0) != 0x80) return {};
      cp = (cp << 6) | (p[k] & 0x3F);
    }
    if (cp < first_checked_) return {n, 0, true};
    const uint16_t prop = props(cp);
    return {n, static_cast<uint8_t>(prop & 0xFF), !(prop & bit_)};
  }

 private:
  uint16_t bit_;
  uint32_t first_checked_;
};

// Appends `text` in `form` (the full algorithm: decompose, reorder, compose). `cps` is scratch.
void normalize_segment(std::string_view text, NormalForm form, std::vector<uint32_t>& cps,
                       std::string& out) {
  cps.clear();
  const bool compat = compatibility(form);
  for (size_t i = 0; i < text.size();) {
    bool valid, incomplete;
    const size_t n = utf8_unit(text, i, valid, incomplete);
    if (!valid) {
      for (size_t k = 0; k < n; ++k)
        cps.push_back(kRawByte | static_cast<unsigned char>(text[i + k]));
      i += n;
      continue;
    }
    decompose(next_code_point(text, i), compat, cps);
  }
  reorder(cps);
  if (composes(form)) compose(cps);
  for (uint32_t cp : cps) append_utf8(cp, out);
}

}  // namespace

std::optional<NormalForm> normal_form_named(std::string_view name) {
  if (name == "NFC") return NormalForm::kNFC;
  if (name == "NFD") return NormalForm::kNFD;
  if (name == "NFKC") return NormalForm::kNFKC;
  if (name == "NFKD") return NormalForm::kNFKD;
  return std::nullopt;
}

bool is_normalized_quick(std::string_view text, NormalForm form) {
  const QuickCheck check(form);
  uint8_t last_class = 0;
  for (size_t i = 0; i < text.size();) {
    const QuickCheck::Verdict v = check.at(text, i);
    if (!v.yes || (v.cls != 0 && last_class > v.cls)) return false;
    last_class = v.cls;
    i += v.length;
  }
  return true;
}

// Only the segments that fail the quick-check are normalized: each runs from the last starter
// that passed it (a character that passes never composes with what precedes it, and no mark is
// reordered across a starter) to the next such starter; the text between is copied.
std::string normalize(std::string_view text, NormalForm form) {
  const QuickCheck check(form);
  std::string out;
  std::vector<uint32_t> cps;
  size_t copied = 0, last_starter = 0;
  uint8_t last_class = 0;
  for (size_t i = 0; i < text.size();) {
    const QuickCheck::Verdict v = check.at(text, i);
    if (v.yes && !(v.cls != 0 && last_class > v.cls)) {
      if (v.cls == 0) last_starter = i;
      last_class = v.cls;
      i += v.length;
      continue;
    }
    size_t end = i + v.length;
    for (QuickCheck::Verdict w; end < text.size(); end += w.length) {
      w = check.at(text, end);
      if (w.yes && w.cls == 0) break;
    }
    out.append(text, copied, last_starter - copied);
    normalize_segment(text.substr(last_starter, end - last_starter), form, cps, out);
    copied = last_starter = i = end;
    last_class = 0;
  }
  out.append(text, copied);
  return out;
}

}  // namespace blend::tok
