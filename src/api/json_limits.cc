#include "api/json_limits.h"

#include <string>
#include <vector>

#include "api/api_error.h"

namespace blend {
namespace {

using nlohmann::json;

// Walks the text as nlohmann's parser does and remembers where it is (keys and array indices),
// so an error can name the field: "'body.temperature': number overflow parsing '1e999'".
// nlohmann's SAX parser keeps its own state on the heap, and this builds no values, so it is
// safe on any depth; parse_client_json runs it only after a failed parse.
class PathTracker : public nlohmann::json_sax<json> {
 public:
  std::string path() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (f.array) {
        if (f.index >= 0) out += "[" + std::to_string(f.index) + "]";
      } else if (!f.key.empty()) {
        out += (out.empty() ? "" : ".") + f.key;
      }
    }
    return out;
  }
  std::string error;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    value();
    frames_.push_back({false, "", -1, 0});
    return true;
  }
  bool key(string_t& k) override {
    frames_.back().key = k;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    value();
    frames_.push_back({true, "", -1, 0});
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // The value being read when the parser gave up belongs to the next array slot.
    if (!frames_.empty() && frames_.back().array) frames_.back().index = frames_.back().next;
    error = e.what();
    return false;
  }

 private:
  struct Frame {
    bool array;
    std::string key;
    int64_t index;  // the array element being read
    int64_t next;
  };
  bool value() {
    if (!frames_.empty() && frames_.back().array) frames_.back().index = frames_.back().next++;
    return true;
  }
  std::vector<Frame> frames_;
};

}  // namespace

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > limit) return limit + 1;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

nlohmann::json parse_client_json(std::string_view text, std::string_view what, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth)
    throw ApiError(400, std::string(what) + " nests arrays/objects more than " +
                            std::to_string(max_depth) + " levels deep");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  // Parse again to say where: a number out of double's range (1e999) is the client's error in
  // the field that holds it, and the only way JSON can spell a non-finite number.
  PathTracker tracker;
  json::sax_parse(text, &tracker);
  const std::string path = tracker.path();
  throw ApiError(400,
                 std::string(what) + " is not valid JSON" +
                     (path.empty() ? std::string() : " at '" + path + "'") + ": " + tracker.error,
                 path);
}

}  // namespace blend
