#include "api/json_limits.h"

#include <chrono>

#include <gtest/gtest.h>

#include "api/api_error.h"

namespace blend {
namespace {

std::string nested(int depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(JsonLimits, DepthCountsBracketsOutsideStringsOnly) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":[]}]})"), 4);
  EXPECT_EQ(json_nesting_depth(R"(["[[[[", "\"[[[", {}])"), 2);  // brackets in strings, escapes
  EXPECT_EQ(json_nesting_depth(nested(1000), 10), 11);           // stops past the limit
}

TEST(JsonLimits, RefusesDeepInputBeforeBuildingIt) {
  EXPECT_NO_THROW(parse_client_json(nested(kMaxClientJsonDepth), "body"));
  // 100,000 levels: nlohmann would build it, and the recursion in whatever reads it overflows
  // the stack (issue 26). Refused in a linear scan instead.
  const auto t0 = std::chrono::steady_clock::now();
  try {
    parse_client_json(R"({"messages":[{"role":"user","content":)" + nested(100000) + "}]}",
                      "the request body");
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("the request body nests"), std::string::npos) << e.what();
  }
  // A hang bound, not a speed goal: generous for a shared CI machine, far below a stack walk.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

TEST(JsonLimits, NamesTheFieldOfAnOutOfRangeNumber) {
  // 1e999 is the only way JSON spells a non-finite number; nlohmann throws out_of_range (not
  // parse_error) for it, which used to escape the batch reader and abort the whole run.
  try {
    parse_client_json(R"({"body":{"prompt":"x","temperature":1e999}})", "line 2");
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "body.temperature");
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("1e999"), std::string::npos);
  }
  try {
    parse_client_json(R"({"a":[1,{"b":[3,-1e400]}]})", "x");
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), "a[1].b[1]");
  }
  EXPECT_THROW(parse_client_json("{oops", "x"), ApiError);
  EXPECT_EQ(parse_client_json(R"({"t":1e300})", "x")["t"].get<double>(), 1e300);
}

}  // namespace
}  // namespace blend
