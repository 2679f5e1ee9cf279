// Internal to the Jinja engine. Lexing: the template into one token stream, as Jinja2's lexer
// does it: text between tags (with trim_blocks, lstrip_blocks and `-`/`+` applied), and the
// tokens inside {{ }} / {% %}. Comments vanish here. Errors are blend::Error naming the line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace blend::jinja {

struct Token {
  enum Kind {
    kData,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Kind kind = kEof;
  std::string text;  // kData: the text; kName, kOp: as written; kString: the decoded value
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

std::string describe(const Token& t);  // for error messages
// The whole template as tokens, ending with one kEof.
std::vector<Token> lex(const std::string& source);

}  // namespace blend::jinja
