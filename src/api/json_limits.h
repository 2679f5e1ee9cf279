// Parsing JSON that a client sent (HTTP bodies, Batch API lines, uploaded files) with a bound
// on nesting depth. nlohmann's parser, serializer and our consumers (the chat template's value
// conversion, dump()) recurse per level, so a 200 KB body of 100,000 nested arrays overflows
// the stack and kills the process (issue 26). The depth is checked by a linear scan of the
// text before nlohmann builds anything, so no deep value ever exists.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

namespace blend {

// Deeper than any request the OpenAI schema describes (a chat body with content parts is ~5
// levels; tool schemas a few dozen), shallow enough for every recursive consumer's stack.
inline constexpr int kMaxClientJsonDepth = 128;

// The deepest nesting of arrays and objects in `text` (0 for a scalar), brackets inside strings
// not counted. Stops scanning once the depth passes `limit` and returns limit + 1. Does not
// validate the text otherwise: on malformed input the result is only an upper bound's guess,
// and the parser that runs next reports the error.
int json_nesting_depth(std::string_view text, int limit = kMaxClientJsonDepth);

// Parses `text`; `what` names it in errors ("the request body", "line 3"). Throws ApiError
// (400) when the text nests deeper than `max_depth` or is not valid JSON.
nlohmann::json parse_client_json(std::string_view text, std::string_view what,
                                 int max_depth = kMaxClientJsonDepth);

}  // namespace blend
