// A small Jinja2 engine: the subset Hugging Face chat templates use, rendered the way
// transformers renders them (trim_blocks and lstrip_blocks on). Statements: for (loop.*,
// else, `if` filter, tuple unpacking), if/elif/else, set (also `ns.attr` on a namespace()).
// Expressions: literals, lists, dicts, attribute/item access, slicing, arithmetic, `~`,
// comparisons, and/or/not, in, is-tests, ternaries, filters and string/dict methods.
// Anything outside the subset is a blend::Error when the template is parsed (naming the
// construct and line), never a silently different prompt.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace blend::jinja {

struct Node;

class Template {
 public:
  explicit Template(const std::string& source);  // throws blend::Error
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // `context` is an object whose members become the template's variables. Keys of objects keep
  // the order they have in `context` (ordered_json), as Python dicts do.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<Node> root_;
};

}  // namespace blend::jinja
