#include "text/utf8.h"

namespace blend::tok {

std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = direct ? b : next++;
  }
  return table;
}

// The WHATWG UTF-8 decoder's view of the bytes at s[i..]: the length of a valid character,
// or of the maximal ill-formed subpart (to be replaced by one U+FFFD). `incomplete` is set when
// the bytes are a valid prefix cut short by the end of the buffer.
size_t utf8_unit(std::string_view s, size_t i, bool& valid, bool& incomplete) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  valid = false;
  incomplete = false;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) {
    valid = true;
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;  // invalid lead byte
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      incomplete = true;
      return k;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return k;  // the subpart ends before this byte
    lo = 0x80;
    hi = 0xBF;
  }
  valid = true;
  return need + 1;
}

// Decodes the character at s[i..] (or U+FFFD for an ill-formed subpart) and advances i.
uint32_t next_code_point(std::string_view s, size_t& i) {
  bool valid, incomplete;
  const size_t n = utf8_unit(s, i, valid, incomplete);
  uint32_t cp = 0xFFFD;
  if (valid) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    cp = n == 1 ? b0 : b0 & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  }
  i += n;
  return cp;
}

void append_replacement(std::string& out) {
  out += "\xEF\xBF\xBD";
}

// Unicode White_Space (what lstrip/rstrip of added tokens strip, as Rust's char::is_whitespace).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

size_t skip_white_space(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t j = i;
    if (!is_white_space(next_code_point(s, j))) break;
    i = j;
  }
  return i;
}

// End of s[begin, end) once trailing white space is removed.
size_t trim_white_space_end(std::string_view s, size_t begin, size_t end) {
  while (end > begin) {
    // The last character starts at the last byte that is not a continuation byte.
    size_t k = end - 1;
    while (k > begin && end - k < 4 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t after = k;
    const uint32_t cp = next_code_point(s, after);
    if (after != end || !is_white_space(cp)) break;
    end = k;
  }
  return end;
}

}  // namespace blend::tok
