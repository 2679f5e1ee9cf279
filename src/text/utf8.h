// Internal to the tokenizer: UTF-8 as the WHATWG decoder reads it, GPT-2's byte alphabet and
// Unicode White_Space.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace blend::tok {

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
std::array<uint32_t, 256> bytes_to_unicode();
// The WHATWG UTF-8 decoder's view of the bytes at s[i..]: the length of a valid character,
// or of the maximal ill-formed subpart (to be replaced by one U+FFFD). `incomplete` is set when
// the bytes are a valid prefix cut short by the end of the buffer.
size_t utf8_unit(std::string_view s, size_t i, bool& valid, bool& incomplete);
// Decodes the character at s[i..] (or U+FFFD for an ill-formed subpart) and advances i.
uint32_t next_code_point(std::string_view s, size_t& i);
void append_replacement(std::string& out);  // U+FFFD
// Unicode White_Space (what lstrip/rstrip of added tokens strip, as Rust's char::is_whitespace).
bool is_white_space(uint32_t cp);
size_t skip_white_space(std::string_view s, size_t i);
// End of s[begin, end) once trailing white space is removed.
size_t trim_white_space_end(std::string_view s, size_t begin, size_t end);

}  // namespace blend::tok
