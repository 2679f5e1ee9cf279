// A small Jinja2 engine: the subset Hugging Face chat templates use, rendered the way
// transformers renders them (jinja2 ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks and the loopcontrols extension; default Undefined).
//
// What it promises:
// - The output equals Jinja2's byte for byte for every template it accepts (checked against
//   python3-jinja2 by tests/text/chat_template_parity_test.cc). Values behave as Python's do:
//   str()/repr() of lists, tuples and dicts, int/float arithmetic, code-point string indexing,
//   Unicode whitespace in strip()/trim/split(), json.dumps for tojson; what filters return
//   behaves like the Python object (map/select/items give a generator: always true, no length,
//   used up by one iteration).
// - Statements: for (loop.*, else, an `if` filter, tuple unpacking), if/elif/else, set (names,
//   tuples, `ns.attr` on a namespace(), the block form), macro (with defaults, recursion),
//   break/continue, comments, whitespace control (`-`, `+`), \r\n and a final newline as
//   Jinja2 reads them.
// - Expressions: literals (string escapes as Python's), lists, tuples, dicts, attribute and item
//   access, slicing, calls of macros and of range/namespace/dict/raise_exception/strftime_now,
//   string methods (strip, split, startswith, replace, upper, ...) and dict methods (get, items,
//   keys, values), arithmetic, `~`, chained comparisons, and/or/not, in/not in, tests,
//   filters (abs capitalize count default/d first float indent int items join last length list
//   lower map reject rejectattr replace reverse round safe select selectattr string title
//   tojson trim unique upper) and the conditional expression.
// - Anything outside the subset (an unknown tag, filter, test, method or function; raw blocks,
//   include/import/extends, call blocks) is a blend::Error when the template is parsed, naming
//   the construct and its line, so a template never renders silently differently. Errors while
//   rendering (an undefined value used as an object, a type error, raise_exception) are
//   blend::Error too, as are the few things Jinja2 does that have no stable output (printing a
//   function or a generator) or that Python can but we cannot (integers beyond 64 bits).
// Known differences: upper/lower/title map case for Latin, Greek, Cyrillic, Armenian and
// Cherokee only (other scripts are left as they are, which is right for the caseless ones);
// identifiers must be ASCII; iterating a used-up generator again is an error here.
//
// Limits. A template comes with a model folder a user downloaded, so it is untrusted input:
// parsing and rendering end, quickly, whatever it does. Reaching a limit is a blend::Error that
// names it; real chat templates stay far below all of them (tests/text/jinja_limits_test.cc):
// - kMaxTreeDepth: how deeply the parsed template nests (a chain `a + b + ...`, `x|f|g|...` or
//   `x.a.b...` nests one level per link), so neither the parser nor the renderer recurses
//   without bound;
// - kMaxRenderDepth: recursion while rendering (statements and expressions inside macro calls
//   inside ...), and at most 200 nested macro calls;
// - kMaxSteps: the work one render may do, counted in statements and expressions evaluated,
//   loop iterations, and the items and bytes (per 64) that filters, methods, printing and
//   comparison go through; a context of many values or long strings adds to it
//   (kStepsPerInputValue per JSON value, a step per kInputBytesPerStep bytes of its strings):
//   the chat templates in tests/text take 33 to 110 steps per message, so 1M steps alone hold
//   9,000 messages, and each message brings about twice what it takes;
// - 64 MiB for any string built, any value printed and the output; 256 MiB for one list a
//   template builds (range() as the sandbox: at most 100,000 items).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace blend::jinja {

struct Node;

inline constexpr int kMaxTreeDepth = 200;
inline constexpr int kMaxRenderDepth = 1000;
inline constexpr int64_t kMaxSteps = 1'000'000;
inline constexpr int64_t kStepsPerInputValue = 64;
inline constexpr int64_t kInputBytesPerStep = 8;

class Template {
 public:
  explicit Template(const std::string& source);  // parses; throws blend::Error
  ~Template();
  Template(const Template&);  // cheap: copies share the immutable parsed template
  Template& operator=(const Template&);
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // `context` is an object whose members become the template's variables. Objects keep the key
  // order they have in `context` (ordered_json), as Python dicts do. Thread-safe: the parsed
  // template is immutable and each call renders with its own state.
  std::string render(const nlohmann::ordered_json& context) const;

  // The same with the variables given one by one (a later one of the same name wins); the JSON
  // they point to is read while rendering, not copied first.
  using Variables = std::vector<std::pair<std::string, const nlohmann::ordered_json*>>;
  std::string render(const Variables& variables) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace blend::jinja
