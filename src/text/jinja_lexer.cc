#include "text/jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "text/jinja_value.h"

namespace blend::jinja {

std::string describe(const Token& t) {
  switch (t.kind) {
    case Token::kData:
      return "template text";
    case Token::kVarBegin:
      return "'{{'";
    case Token::kVarEnd:
      return "end of print statement '}}'";
    case Token::kBlockBegin:
      return "'{%'";
    case Token::kBlockEnd:
      return "end of statement block '%}'";
    case Token::kString:
      return "string " + str_repr(t.text);
    case Token::kEof:
      return "end of template";
    default:
      return "'" + t.text + "'";
  }
}

namespace {

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize(source)) {}

  std::vector<Token> run() {
    bool line_starting = true;  // the last tag ended a line: lstrip_blocks applies at pos 0
    while (pos_ < src_.size()) {
      const size_t open = find_tag(pos_);
      const size_t text_end = open == std::string::npos ? src_.size() : open;
      std::string text = src_.substr(pos_, text_end - pos_);
      const int text_line = line_;
      advance(text_end);
      if (open == std::string::npos) {
        emit_data(std::move(text), text_line);
        break;
      }
      const char kind = src_[open + 1];
      const char sign = open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+')
                            ? src_[open + 2]
                            : 0;
      if (sign == '-') {
        text = py_strip(text, nullptr, false, true);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag preceded on its line by whitespace only takes
        // that whitespace away.
        const size_t nl = text.rfind('\n');
        const size_t start = nl == std::string::npos ? 0 : nl + 1;
        if ((nl != std::string::npos || line_starting) && start < text.size() &&
            py_strip(text.substr(start), nullptr, true, false).empty())
          text.resize(start);
      }
      emit_data(std::move(text), text_line);
      pos_ = open + 2 + (sign ? 1 : 0);
      line_starting = kind == '#' ? lex_comment() : lex_tag(kind);
    }
    out_.push_back(Token{Token::kEof, "", 0, 0, line_});
    return std::move(out_);
  }

 private:
  // Jinja2 reads \r\n and \r as \n and drops one trailing newline (keep_trailing_newline off).
  static std::string normalize(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '\r') {
        out += '\n';
        if (k + 1 < s.size() && s[k + 1] == '\n') ++k;
      } else {
        out += s[k];
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  size_t find_tag(size_t from) const {
    for (size_t k = src_.find('{', from); k != std::string::npos; k = src_.find('{', k + 1))
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#'))
        return k;
    return std::string::npos;
  }

  void advance(size_t to) {  // moves pos_ to `to`, counting lines
    for (; pos_ < to; ++pos_) line_ += src_[pos_] == '\n';
  }

  bool at(const char* s) const { return src_.compare(pos_, std::strlen(s), s) == 0; }

  void emit_data(std::string text, int line) {
    if (!text.empty()) out_.push_back(Token{Token::kData, std::move(text), 0, 0, line});
  }

  // After a tag's closing marker: `-` eats all whitespace, trim_blocks one newline, `+` and
  // `}}` nothing. Returns whether what was eaten ends a line (Jinja2's line_starting).
  bool finish(char mode) {
    const size_t start = pos_;
    if (mode == '-') {
      skip_space();
    } else if (mode == 't' && pos_ < src_.size() && src_[pos_] == '\n') {
      advance(pos_ + 1);
    }
    return pos_ > start && src_[pos_ - 1] == '\n';
  }

  void skip_space() {  // inside a tag; Unicode whitespace too, as Jinja2's \s
    while (pos_ < src_.size()) {
      size_t next = pos_;
      if (!py_isspace(next_cp(src_, next))) return;
      advance(next);
    }
  }

  bool lex_comment() {
    const int line = line_;
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail(line, "unclosed comment '{#'");
    const char sign = close > pos_ ? src_[close - 1] : 0;
    advance(close + 2);
    return finish(sign == '-' ? '-' : sign == '+' ? '+' : 't');
  }

  bool lex_tag(char kind) {
    const int open_line = line_;
    out_.push_back(Token{kind == '%' ? Token::kBlockBegin : Token::kVarBegin, "", 0, 0, line_});
    std::vector<char> brackets;  // the end marker only counts outside brackets
    for (;;) {
      skip_space();
      if (pos_ >= src_.size())
        fail(open_line, kind == '%' ? "unclosed '{%' tag" : "unclosed '{{' tag");
      if (brackets.empty()) {
        const char* marker = nullptr;
        char mode = 0;
        if (kind == '%') {
          marker = at("-%}") ? "-%}" : at("+%}") ? "+%}" : at("%}") ? "%}" : nullptr;
          mode = marker ? (marker[0] == '%' ? 't' : marker[0]) : 0;
        } else {
          marker = at("-}}") ? "-}}" : at("}}") ? "}}" : nullptr;
          mode = marker && marker[0] == '-' ? '-' : 0;
        }
        if (marker) {
          out_.push_back(Token{kind == '%' ? Token::kBlockEnd : Token::kVarEnd, "", 0, 0, line_});
          advance(pos_ + std::strlen(marker));
          return finish(mode);
        }
      }
      lex_token(brackets);
    }
  }

  void lex_token(std::vector<char>& brackets) {
    Token t;
    t.line = line_;
    const char c = src_[pos_];
    if (c == '\'' || c == '"') {
      lex_string(t);
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number(t);
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos_;
      while (e < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
        ++e;
      t.kind = Token::kName;
      t.text = src_.substr(pos_, e - pos_);
      advance(e);
    } else {
      static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                         "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                         ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
      for (const char* op : kOps) {
        if (at(op)) {
          t.kind = Token::kOp;
          t.text = op;
          break;
        }
      }
      if (t.kind != Token::kOp) {
        size_t k = pos_;
        std::string ch;
        put_cp(ch, next_cp(src_, k));
        fail(line_, "unexpected character '" + ch + "'");
      }
      const char o = t.text[0];
      if (t.text.size() == 1 && (o == '(' || o == '[' || o == '{')) {
        brackets.push_back(o == '(' ? ')' : o == '[' ? ']' : '}');
      } else if (t.text.size() == 1 && (o == ')' || o == ']' || o == '}')) {
        if (brackets.empty() || brackets.back() != o) fail(line_, "unexpected '" + t.text + "'");
        brackets.pop_back();
      }
      advance(pos_ + t.text.size());
    }
    out_.push_back(std::move(t));
  }

  // A string literal, decoded as Jinja2 decodes it (Python's unicode-escape).
  void lex_string(Token& t) {
    const char quote = src_[pos_];
    size_t e = pos_ + 1;
    while (e < src_.size() && src_[e] != quote) e += src_[e] == '\\' ? 2 : 1;
    if (e >= src_.size()) fail(line_, "unterminated string literal");
    const std::string body = src_.substr(pos_ + 1, e - pos_ - 1);
    std::string v;
    for (size_t k = 0; k < body.size(); ++k) {
      if (body[k] != '\\') {
        v += body[k];
        continue;
      }
      const char n = body[++k];
      auto hex = [&](size_t digits) {
        uint32_t cp = 0;
        for (size_t d = 1; d <= digits; ++d) {
          const char h = k + d < body.size() ? body[k + d] : 0;
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail(line_, "truncated \\" + std::string(1, n) + " escape");
          cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                   ? h - '0'
                                                   : std::tolower(h) - 'a' + 10);
        }
        k += digits;
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
          fail(line_, "unsupported code point in \\" + std::string(1, n) + " escape");
        put_cp(v, cp);
      };
      switch (n) {
        case '\n':  // a backslash at the end of a line continues the string
          break;
        case '\\':
        case '\'':
        case '"':
          v += n;
          break;
        case 'a':
          v += '\a';
          break;
        case 'b':
          v += '\b';
          break;
        case 'f':
          v += '\f';
          break;
        case 'n':
          v += '\n';
          break;
        case 'r':
          v += '\r';
          break;
        case 't':
          v += '\t';
          break;
        case 'v':
          v += '\v';
          break;
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        case 'N':
          fail(line_, "\\N{...} escapes are not supported");
        default:
          if (n >= '0' && n <= '7') {  // up to three octal digits
            uint32_t cp = static_cast<uint32_t>(n - '0');
            for (int d = 0;
                 d < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; ++d)
              cp = cp * 8 + static_cast<uint32_t>(body[++k] - '0');
            put_cp(v, cp);
          } else if (static_cast<unsigned char>(n) >= 0x80) {
            fail(line_, "unsupported escape of a non-ASCII character");
          } else {  // unknown escapes stay as written
            v += '\\';
            v += n;
          }
      }
    }
    t.kind = Token::kString;
    t.text = std::move(v);
    advance(e + 1);
  }

  // Integers (1_000 too) and floats (1.5, 1e3, 2.5e-3), as Jinja2's number rules read them.
  void lex_number(Token& t) {
    auto digits = [&](size_t k) {  // end of a run of digits with single underscores between
      while (k < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[k])) ||
                                 (src_[k] == '_' && k + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[k + 1])))))
        ++k;
      return k;
    };
    size_t e = digits(pos_);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      e = digits(e + 1);
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        is_float = true;
        e = digits(x);
      }
    }
    std::string num = src_.substr(pos_, e - pos_);
    num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
    if (is_float) {
      t.kind = Token::kFloat;
      t.f = std::strtod(num.c_str(), nullptr);
    } else {
      if (num.size() > 1 && num[0] == '0' && num.find_first_not_of('0') != std::string::npos)
        fail(line_, "invalid integer literal '" + num + "'");
      errno = 0;
      t.kind = Token::kInt;
      t.i = std::strtoll(num.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(line_, "integer literal '" + num + "' is too large");
    }
    t.text = num;
    advance(e);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) {
  return Lexer(source).run();
}

}  // namespace blend::jinja
