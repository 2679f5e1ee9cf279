// Internal to the tokenizer: the pre-tokenizer regex (PCRE2, UTF + UCP, JIT).
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>
#include <string_view>

#include "core/error.h"

namespace blend::tok {

// `\s` / `\S` -> Unicode White_Space. PCRE2's UCP `\s` also takes U+180E, which Unicode no longer
// counts as white space and neither tiktoken (Llama-3's own tokenizer) nor the Rust tokenizers do.
std::string translate_pattern(std::string_view pattern);

// Owns a compiled PCRE2 pattern; each thread gets its own match data and JIT stack.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    // UCP is not allowed (nor needed) with LITERAL.
    const uint32_t flags =
        PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    const std::string source = literal ? pattern : translate_pattern(pattern);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(), flags, &err,
                          &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(where + ": pre-tokenizer regex does not compile: " +
                  reinterpret_cast<char*>(msg) + " (in " + pattern + ")");
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls f(begin, end) for every piece of text in order: the matches and, since Split's
  // behaviour is Isolated, the non-empty gaps between them. kMergedWithPrevious: each match
  // ends the piece that the gap before it starts (Split's MergedWithPrevious).
  template <bool kMergedWithPrevious = false, typename F>
  void for_each_piece(std::string_view text, F&& f) const {
    Thread& t = thread_state();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0, last = 0;
    while (start < text.size()) {
      int rc = PCRE2_ERROR_NOMATCH;
      if (jit_) rc = pcre2_jit_match(code_, subject, text.size(), start, 0, t.data, t.context);
      // The interpreter takes over when the JIT is unavailable or ran out of stack.
      if (!jit_ || (rc < 0 && rc != PCRE2_ERROR_NOMATCH))
        rc = pcre2_match(code_, subject, text.size(), start, 0, t.data, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw Error(std::string("tokenizer: pre-tokenizer regex failed: ") +
                    reinterpret_cast<char*>(msg));
      }
      // Copied out: f may run the next pre-tokenizer step, which reuses this thread's match data.
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(t.data);
      const size_t begin = ov[0], end = ov[1];
      if (begin == end) {  // empty match: step over one character
        start = begin + 1;
        while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
          ++start;
        continue;
      }
      if constexpr (kMergedWithPrevious) {
        f(last, end);
      } else {
        if (begin > last) f(last, begin);
        f(begin, end);
      }
      start = last = end;
    }
    if (last < text.size()) f(last, text.size());
  }

 private:
  struct Thread {
    pcre2_match_data* data = nullptr;
    pcre2_jit_stack* stack = nullptr;
    pcre2_match_context* context = nullptr;
    Thread() {
      data = pcre2_match_data_create(1, nullptr);
      // The default 32 KiB JIT stack is too small for very long runs of one character class.
      stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
      context = pcre2_match_context_create(nullptr);
      pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~Thread() {
      pcre2_match_context_free(context);
      pcre2_jit_stack_free(stack);
      pcre2_match_data_free(data);
    }
  };
  static Thread& thread_state() {
    thread_local Thread t;
    return t;
  }

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace blend::tok
