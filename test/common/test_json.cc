// JsonNode paths and type errors, strict parsing, JsonWriter output.
#include <catch2/catch.hpp>

#include "common/errors.h"
#include "common/json.h"

using namespace dtrain::common;

TEST_CASE("nested paths appear in type errors") {
  JsonDocument doc = JsonDocument::parse(R"({"a": {"b": [1, {"c": "x"}]}})", "t");
  JsonNode c = doc.root().at("a").at("b").as_array()[1].at("c");
  CHECK(c.path() == "a.b[1].c");
  CHECK_THROWS_WITH(c.as_int(0, 1), "a.b[1].c: expected an integer, found \"x\"");
  CHECK_THROWS_WITH(doc.root().at("a").at("z"), "a: missing required key \"z\"");
  CHECK_THROWS_WITH(doc.root().as_string(), "top level: expected a string, found an object");
}

TEST_CASE("parse errors give line and column") {
  CHECK_THROWS_WITH(JsonDocument::parse("{\n  \"a\": 1,\n  \"b\" 2\n}", "f.json"),
                    Catch::StartsWith("f.json: line 3, column 7: invalid JSON"));
}

TEST_CASE("numbers: integers must be integral and in range") {
  JsonDocument doc = JsonDocument::parse(R"({"i": 3, "f": 3.0, "g": 3.5, "big": 1e300})", "t");
  CHECK(doc.root().at("i").as_int(0, 10) == 3);
  CHECK(doc.root().at("f").as_int(0, 10) == 3);
  CHECK_THROWS_AS(doc.root().at("g").as_int(0, 10), ConfigError);
  CHECK_THROWS_AS(doc.root().at("big").as_int(0, 10), ConfigError);
  CHECK_THROWS_WITH(doc.root().at("i").as_int(5, 10),
                    "i: expected an integer from 5 to 10, found 3");
  CHECK(doc.root().at("g").as_number(0, 4) == 3.5);
}

TEST_CASE("numbers RapidJSON 1.1.0 misreads in full precision are read exactly") {
  // Found by fuzz_job_spec and fuzz_tf_config (UBSan: __builtin_clzll(0) in RapidJSON's
  // DiyFp::Normalize; an index past its table of cached powers): zeros with an exponent or many
  // digits, an integer just past 2^64, and long mantissas with large exponents.
  JsonDocument doc = JsonDocument::parse(
      R"({"a": 0e90, "b": -0E+40, "c": 0.000e99, "d": [0e-7, 10e2], "s": "0e90", "e": 2.5e-3,
          "f": 0.0000000000000000000000000000000, "g": 100.000000000000000000000000001,
          "h": 184467440737095516155, "i": 7007777777777777777777777777777777777e-300,
          "j": 1e-400, "k": 0.1, "l": -9223372036854775808, "m": 18446744073709551615})",
      "t");
  CHECK(doc.root().at("a").as_number(0, 1) == 0.0);
  CHECK(doc.root().at("b").as_number(-1, 1) == 0.0);
  CHECK(doc.root().at("c").as_number(0, 1) == 0.0);
  CHECK(doc.root().at("d").as_array()[0].as_number(0, 1) == 0.0);
  CHECK(doc.root().at("d").as_array()[1].as_number(0, 2000) == 1000.0);
  CHECK(doc.root().at("s").as_string() == "0e90");  // strings are left alone
  CHECK(doc.root().at("e").as_number(0, 1) == 2.5e-3);
  CHECK(doc.root().at("f").as_number(0, 1) == 0.0);
  CHECK(doc.root().at("g").as_number(0, 200) == 100.0);
  CHECK(doc.root().at("h").as_number(0, 1e21) == 184467440737095516155.0);
  CHECK(doc.root().at("i").as_number(0, 1) == 7007777777777777777777777777777777777e-300);
  CHECK(doc.root().at("j").as_number(0, 1) == 0.0);
  CHECK(doc.root().at("k").as_number(0, 1) == 0.1);  // correctly rounded, as before
  CHECK(doc.root().at("l").dump() == "-9223372036854775808");
  CHECK(doc.root().at("m").dump() == "18446744073709551615");
  CHECK_THROWS_WITH(JsonDocument::parse(R"({"a": 1e400})", "t"),
                    "t: line 1, column 7: invalid JSON: Number too big to be stored in double.");
  CHECK_THROWS_WITH(JsonDocument::parse(R"({"a": 0e})", "t"),
                    Catch::StartsWith("t: line 1, column 9: invalid JSON"));
  CHECK_THROWS_AS(JsonDocument::parse(R"({"a": 00.0})", "t"), ConfigError);
}

TEST_CASE("a lone surrogate escape is refused, a pair is one character") {
  // Found by fuzz_job_spec: RapidJSON 1.1.0 decodes "\udcCC" into bytes that are not UTF-8, so
  // an accepted job wrote a spec.json that no longer parsed.
  CHECK_THROWS_WITH(JsonDocument::parse(R"({"a": "x\udcCCy"})", "t"),
                    Catch::StartsWith("t: line 1, column ") &&
                        Catch::EndsWith("a \\u escape names a lone UTF-16 surrogate"));
  CHECK_THROWS_AS(JsonDocument::parse(R"({"k\udfff": 1})", "t"), ConfigError);
  CHECK_THROWS_AS(JsonDocument::parse(R"(["\ud800"])", "t"), ConfigError);  // RapidJSON's own
  JsonDocument pair = JsonDocument::parse(R"({"a": "\ud83d\ude00"})", "t");
  CHECK(pair.root().at("a").as_string() == "\xF0\x9F\x98\x80");
}

TEST_CASE("duplicate keys are found at any depth") {
  CHECK_THROWS_WITH(JsonDocument::parse(R"({"a": [{"k": 1, "k": 2}]})", "t"),
                    "t: a[0]: key \"k\" appears more than once");
}

TEST_CASE("check_keys names the unknown key and the allowed ones") {
  JsonDocument doc = JsonDocument::parse(R"({"x": {"good": 1, "bad": 2}})", "t");
  CHECK_NOTHROW(doc.root().at("x").check_keys({"good", "bad"}));
  CHECK_THROWS_WITH(doc.root().at("x").check_keys({"good"}),
                    "x: unknown key \"bad\" (expected one of: good)");
}

TEST_CASE("JsonWriter writes compact JSON that parses back") {
  JsonWriter w;
  w.begin_object()
      .key("s")
      .value("a\"b\n")
      .key("i")
      .value(int64_t{-3})
      .key("d")
      .value(0.5)
      .key("b")
      .value(true)
      .key("n")
      .null()
      .key("nan")
      .value(std::nan(""))
      .key("raw")
      .raw(R"({"x":[1,2]})")
      .key("arr")
      .begin_array()
      .value(1)
      .end_array()
      .end_object();
  CHECK(
      w.str() ==
      R"({"s":"a\"b\n","i":-3,"d":0.5,"b":true,"n":null,"nan":null,"raw":{"x":[1,2]},"arr":[1]})");
  CHECK_NOTHROW(JsonDocument::parse(w.str(), "w"));
  CHECK(json_quote("tab\there") == R"("tab\there")");
}

namespace {
std::string nested_arrays(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}
}  // namespace

TEST_CASE("nesting up to kMaxJsonDepth parses; one level more is refused with where") {
  CHECK_NOTHROW(JsonDocument::parse(nested_arrays(kMaxJsonDepth), "t"));
  CHECK_THROWS_WITH(JsonDocument::parse("\n" + nested_arrays(kMaxJsonDepth + 1), "job.json"),
                    fmt::format("job.json: line 2, column {}: nested more than {} levels deep",
                                kMaxJsonDepth + 1, kMaxJsonDepth));
  // Brackets inside strings are text, not nesting.
  std::string deep_text = "{\"k\": \"" + nested_arrays(1000) + "\\\"[\"}";
  CHECK(JsonDocument::parse(deep_text, "t").root().at("k").as_string().size() == 2002);
}

TEST_CASE("hostile nesting (20,000 levels, objects and arrays) is an error, not a crash") {
  std::string objects;
  for (int i = 0; i < 20000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(20000, '}');
  CHECK_THROWS_WITH(
      JsonDocument::parse(objects, "control message"),
      Catch::StartsWith("control message: line 1, column ") && Catch::Contains("nested more than"));
  CHECK_THROWS_AS(JsonDocument::parse(nested_arrays(20000), "t"), ConfigError);
  // Unbalanced: only opening brackets.
  CHECK_THROWS_AS(JsonDocument::parse(std::string(100000, '['), "t"), ConfigError);
}

TEST_CASE("a duplicate key deep down is named by its full path") {
  std::string text = "{\"a\": [[{\"b\": {\"k\": 1, \"k\": 2}}]]}";
  CHECK_THROWS_WITH(JsonDocument::parse(text, "t"),
                    "t: a[0][0].b: key \"k\" appears more than once");
}
