// Text as Python sees it: code points, Unicode whitespace, simple case mapping, strip and
// splitlines, as str's methods behave.
#include <algorithm>
#include <cstddef>

#include "text/jinja_value.h"

namespace blend::jinja {

uint32_t next_cp(std::string_view s, size_t& k) {
  const auto c = static_cast<unsigned char>(s[k]);
  const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 1) {
    ++k;
    return c;
  }
  if (n == 0 || k + static_cast<size_t>(n) > s.size()) {
    ++k;
    return kRawByte + c;
  }
  uint32_t cp = c & (0x7Fu >> n);
  for (int j = 1; j < n; ++j) {
    const auto cc = static_cast<unsigned char>(s[k + static_cast<size_t>(j)]);
    if ((cc & 0xC0) != 0x80) {
      ++k;
      return kRawByte + c;
    }
    cp = (cp << 6) | (cc & 0x3Fu);
  }
  k += static_cast<size_t>(n);
  return cp;
}

void put_cp(std::string& out, uint32_t cp) {
  if (cp >= kRawByte) {
    out += static_cast<char>(cp - kRawByte);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

Cps to_cps(std::string_view s) {
  Cps out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size();) out.push_back(next_cp(s, k));
  return out;
}

std::string from_cps(const Cps& cps, size_t b, size_t e) {
  std::string out;
  for (size_t k = b; k < e; ++k) put_cp(out, cps[k]);
  return out;
}

size_t cp_count(std::string_view s) {
  size_t n = 0;
  for (size_t k = 0; k < s.size(); ++n) next_cp(s, k);
  return n;
}

// str.isspace(), which is also what str.strip()/split() and the regex \s use.
bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

namespace {

// Simple case mapping for the scripts chat text commonly uses: ASCII, Latin-1, Latin
// Extended-A/B and Extended Additional (Vietnamese), Greek (not polytonic), Cyrillic, Armenian,
// Cherokee and fullwidth Latin. Characters of other scripts are left as they are.
uint32_t map_case(uint32_t c, bool to_upper) {
  struct Offset {
    uint32_t lo, hi;  // upper-case letters in [lo, hi] have their lower case at + delta
    int32_t delta;
  };
  static constexpr Offset kOffsets[] = {
      {'A', 'Z', 32},       {0xC0, 0xD6, 32},   {0xD8, 0xDE, 32},         {0x178, 0x178, -121},
      {0x386, 0x386, 38},   {0x388, 0x38A, 37}, {0x38C, 0x38C, 64},       {0x38E, 0x38F, 63},
      {0x391, 0x3A1, 32},   {0x3A3, 0x3AB, 32}, {0x400, 0x40F, 80},       {0x410, 0x42F, 32},
      {0x4C0, 0x4C0, 15},   {0x531, 0x556, 48}, {0x13A0, 0x13EF, 0x97D0}, {0x13F0, 0x13F5, 8},
      {0xFF21, 0xFF3A, 32},
  };
  struct Pairs {
    uint32_t lo, hi;  // alternating upper (at lo, lo + 2, ...) and lower case letters
  };
  static constexpr Pairs kPairs[] = {
      {0x100, 0x12F}, {0x132, 0x137},   {0x139, 0x148},   {0x14A, 0x177}, {0x179, 0x17E},
      {0x1CD, 0x1DC}, {0x1DE, 0x1EF},   {0x1F4, 0x1F5},   {0x1F8, 0x21F}, {0x222, 0x233},
      {0x246, 0x24F}, {0x3D8, 0x3EF},   {0x460, 0x481},   {0x48A, 0x4BF}, {0x4C1, 0x4CE},
      {0x4D0, 0x52F}, {0x1E00, 0x1E95}, {0x1EA0, 0x1EFF},
  };
  if (c < 0x80) {
    if (to_upper) return c >= 'a' && c <= 'z' ? c - 32 : c;
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
  }
  // The digraphs DŽ Dž dž, LJ Lj lj, NJ Nj nj, DZ Dz dz: upper, title and lower case forms.
  for (uint32_t base : {0x1C4u, 0x1C7u, 0x1CAu, 0x1F1u})
    if (c >= base && c < base + 3) return to_upper ? base : base + 2;
  for (const auto& o : kOffsets) {
    if (to_upper) {
      const auto lo = static_cast<uint32_t>(static_cast<int64_t>(o.lo) + o.delta);
      const auto hi = static_cast<uint32_t>(static_cast<int64_t>(o.hi) + o.delta);
      if (c >= lo && c <= hi) return static_cast<uint32_t>(static_cast<int64_t>(c) - o.delta);
    } else if (c >= o.lo && c <= o.hi) {
      return static_cast<uint32_t>(static_cast<int64_t>(c) + o.delta);
    }
  }
  for (const auto& p : kPairs) {
    if (c < p.lo || c > p.hi) continue;
    const bool is_upper = (c - p.lo) % 2 == 0;
    if (to_upper) return is_upper ? c : c - 1;
    return is_upper && c < p.hi ? c + 1 : c;
  }
  if (to_upper) {
    if (c == 0xB5) return 0x39C;   // micro sign
    if (c == 0x3C2) return 0x3A3;  // final sigma
    if (c == 0x131) return 'I';    // dotless i
    if (c == 0x17F) return 'S';    // long s
  } else if (c == 0x1E9E) {
    return 0xDF;  // capital sharp s
  }
  return c;
}

bool is_upper_cp(uint32_t c) {
  return map_case(c, false) != c || c == 0x130;
}
bool is_lower_cp(uint32_t c) {
  return map_case(c, true) != c || c == 0xDF || c == 0x149;
}
bool is_cased_cp(uint32_t c) {
  return is_upper_cp(c) || is_lower_cp(c);
}

void put_upper(std::string& out, uint32_t c, bool title) {
  if (c == 0xDF) {  // sharp s has no one-letter upper case
    out += title ? "Ss" : "SS";
  } else if (c == 0x149) {
    put_cp(out, 0x2BC);
    out += 'N';
  } else if (title && ((c >= 0x1C4 && c <= 0x1CC) || (c >= 0x1F1 && c <= 0x1F3))) {
    put_cp(out, map_case(c, true) + 1);  // the digraph's title-case form, as Dž
  } else {
    put_cp(out, map_case(c, true));
  }
}

// Lower-cases cps[b, e); Python lower-cases a capital sigma that ends a word (judged within
// all of cps) to final sigma.
void put_lower(std::string& out, const Cps& cps, size_t b, size_t e) {
  for (size_t k = b; k < e; ++k) {
    const uint32_t c = cps[k];
    if (c == 0x130) {
      out += "i\xCC\x87";  // i + combining dot above
    } else if (c == 0x3A3 && k > 0 && is_cased_cp(cps[k - 1]) &&
               (k + 1 >= cps.size() || !is_cased_cp(cps[k + 1]))) {
      put_cp(out, 0x3C2);
    } else {
      put_cp(out, map_case(c, false));
    }
  }
}

}  // namespace

std::string py_upper(const std::string& s) {
  std::string out;
  for (uint32_t c : to_cps(s)) put_upper(out, c, false);
  return out;
}

std::string py_lower(const std::string& s) {
  const Cps cps = to_cps(s);
  std::string out;
  put_lower(out, cps, 0, cps.size());
  return out;
}

std::string py_capitalize(const std::string& s) {  // str.capitalize()
  const Cps cps = to_cps(s);
  std::string out;
  if (cps.empty()) return out;
  put_upper(out, cps[0], true);
  put_lower(out, cps, 1, cps.size());
  return out;
}

std::string py_title(const std::string& s) {  // str.title()
  const Cps cps = to_cps(s);
  std::string out;
  bool prev_cased = false;
  for (size_t k = 0; k < cps.size(); ++k) {
    if (prev_cased) {
      put_lower(out, cps, k, k + 1);
    } else {
      put_upper(out, cps[k], true);
    }
    prev_cased = is_cased_cp(cps[k]);
  }
  return out;
}

// Jinja2's `title` filter (not str.title()): words start after runs of whitespace, '-', '(',
// '{', '[' or '<'; each word's first letter is upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s) {
  const Cps cps = to_cps(s);
  auto is_sep = [](uint32_t c) {
    return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  for (size_t k = 0; k < cps.size();) {
    if (is_sep(cps[k])) {
      put_cp(out, cps[k++]);
      continue;
    }
    size_t e = k;
    while (e < cps.size() && !is_sep(cps[e])) ++e;
    put_upper(out, cps[k], false);
    const Cps rest(cps.begin() + static_cast<std::ptrdiff_t>(k + 1),
                   cps.begin() + static_cast<std::ptrdiff_t>(e));
    put_lower(out, rest, 0, rest.size());  // Jinja2 lower-cases word[1:] on its own
    k = e;
  }
  return out;
}

bool py_islower(const std::string& s) {
  bool cased = false;
  for (uint32_t c : to_cps(s)) {
    if (is_upper_cp(c)) return false;
    cased |= is_lower_cp(c);
  }
  return cased;
}

bool py_isupper(const std::string& s) {
  bool cased = false;
  for (uint32_t c : to_cps(s)) {
    if (is_lower_cp(c)) return false;
    cased |= is_upper_cp(c);
  }
  return cased;
}

// str.strip(chars) / lstrip / rstrip; chars == nullptr strips whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const Cps cps = to_cps(s);
  const Cps set = chars ? to_cps(*chars) : Cps();
  auto strip = [&](uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return from_cps(cps, b, e);
}

// str.splitlines(): the line boundaries Python knows, \r\n counting as one.
std::vector<std::string> py_splitlines(const std::string& s) {
  const Cps cps = to_cps(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
        c == 0x2028 || c == 0x2029) {
      lines.push_back(from_cps(cps, start, k));
      if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
      start = k + 1;
    }
  }
  if (start < cps.size()) lines.push_back(from_cps(cps, start, cps.size()));
  return lines;
}
}  // namespace blend::jinja
