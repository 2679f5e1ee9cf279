// Unit tests of the Jinja engine (text/jinja.h), one group per construct. Every expected string
// here is what Jinja2 renders for the same template and context, configured as transformers
// configures it (tests/text/render_jinja2.py produced them); chat_template_parity_test.cc
// checks whole chat templates against Jinja2 itself.
#include "text/jinja.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace blend::jinja {
namespace {

using ojson = nlohmann::ordered_json;

const ojson& context() {
  static const ojson c = ojson::parse(R"json({
    "messages": [
      {"role": "system", "content": " Be brief.\n"},
      {"role": "user", "content": "Hi é 😀"},
      {"role": "assistant", "content": "Hello!", "tool_calls": [
        {"function": {"name": "f", "arguments": {"a": 1, "b": [1.5, null, true]}}}]}],
    "s": "  Hello World  ", "n": 7, "x": 2.5, "l": [3, 1, 2],
    "d": {"b": 1, "a": [1, {"k": "v"}]}, "empty": ""})json");
  return c;
}

std::string render(const std::string& source, const ojson& ctx = context()) {
  return Template(source).render(ctx);
}

// The message of the blend::Error that parsing (or rendering) `source` throws; "" if none.
std::string error_of(const std::string& source) {
  try {
    render(source);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaTest, Literals) {
  EXPECT_EQ(
      render("{{ 'single' }} {{ \"double\" }} {{ 'a' 'b' }} {{ 'esc\\t\\'q\\' \\u00e9\\x41' }}"),
      "single double ab esc\t'q' éA");
  EXPECT_EQ(render("{{ 42 }} {{ 1_000 }} {{ 2.5 }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ -0.0 }}"),
            "42 1000 2.5 1000.0 0.30000000000000004 -0.0");
  EXPECT_EQ(render("{{ true }} {{ True }} {{ false }} {{ none }} {{ None }}"),
            "True True False None None");
  EXPECT_EQ(
      render(
          "{{ [1, 'a', none, 2.0, true] }} {{ (1,) }} {{ (1, 'b') }} {{ {'k': 'v', 'n': [1]} }}"),
      "[1, 'a', None, 2.0, True] (1,) (1, 'b') {'k': 'v', 'n': [1]}");
}

TEST(JinjaTest, Output) {
  EXPECT_EQ(render("[{{ missing }}] [{{ messages[9] }}] {{ l }} {{ d }}"),
            "[] [] [3, 1, 2] {'b': 1, 'a': [1, {'k': 'v'}]}");
  EXPECT_EQ(render("{{ messages[1] }}"), "{'role': 'user', 'content': 'Hi é 😀'}");
  EXPECT_EQ(render("{{ ['it\\'s', 'say \"hi\"', 'nl\\n'] }}"), "[\"it's\", 'say \"hi\"', 'nl\\n']");
}

TEST(JinjaTest, WhitespaceControl) {
  EXPECT_EQ(render("a\n{% if true %}\nb\n{% endif %}\nc\n"), "a\nb\nc");
  EXPECT_EQ(render("a\n    {% if true %}\n    b\n    {% endif %}\nc"), "a\n    b\nc");
  EXPECT_EQ(render("a  {% if true %}  b  {% endif %}  c"), "a    b    c");
  EXPECT_EQ(render("a\n  {%- if true -%}\n  b\n  {%- endif -%}\n  c"), "abc");
  EXPECT_EQ(render("{{ 1 -}}\n\n   {{ 2 }}  {{- 3 }}"), "123");
  EXPECT_EQ(render("  {{ 'x' }}\n  {% if true %}y{% endif %}"), "  x\ny");
  EXPECT_EQ(render("x {# note #} y\n  {# own line #}\nz"), "x  y\nz");
  EXPECT_EQ(render("{%+ if true %}a{% endif %}\n  {%+ if true %}b{% endif %}"), "a  b");
  EXPECT_EQ(render("{% if true +%}\nkept\n{% endif %}"), "\nkept\n");
  EXPECT_EQ(render("one\r\ntwo\r\n{% if true %}\r\nthree\r\n{% endif %}\r\n"), "one\ntwo\nthree\n");
  EXPECT_EQ(render("{% for i in [1, 2] %}\n  {{- i }}\n{%- endfor %}\nend\n\n"), "12end\n");
  EXPECT_EQ(render("{{- \"}}\" }}{{ '%}' }}{{ {'a': {'b': 1}}['a'] }}"), "}}%}{'b': 1}");
}

TEST(JinjaTest, For) {
  EXPECT_EQ(
      render("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
             "loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}"),
      "1032TrueFalse3 2121FalseFalse3 3210FalseTrue3 ");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k, v in d|items "
                   "%}{{ k }};{% endfor %} {% for k in d %}{{ k }}{% endfor %}"),
            "b=1;a=[1, {'k': 'v'}]; b;a; ba");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %} {% for x in l if x > 1 %}{{ x "
                   "}}:{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}"),
            "empty 3:1/2 2:2/2 ");
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 "
                   "%}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "0134");
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% "
                   "endfor %}{{ loop.index }}|{% endfor %}"),
            "1x1 1y2 1|2x1 2y2 2|");
  EXPECT_EQ(render("{% for x in l %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} {% endfor %}"),
            "<3>1 3<1>2 1<2> ");
  EXPECT_EQ(render("{% for c in 'héllo' %}{{ c }}.{% endfor %}"), "h.é.l.l.o.");
}

TEST(JinjaTest, IfAndConditional) {
  EXPECT_EQ(render("{% if n > 10 %}big{% elif n > 5 %}medium{% else %}small{% endif %}"), "medium");
  EXPECT_EQ(render("{{ 'y' if n else 'n' }} [{{ 'y' if not n }}] {{ 'a' if false else 'b' if true "
                   "else 'c' }}"),
            "y [] b");
}

TEST(JinjaTest, Set) {
  EXPECT_EQ(
      render("{% set a = 1 %}{% set b, c = 2, 3 %}{% set t = 4, 5 %}{{ a }}{{ b }}{{ c }}{{ t }}"),
      "123(4, 5)");
  EXPECT_EQ(
      render("{% set x = 'outer' %}{% for i in l %}{% set x = i %}{{ x }}{% endfor %} {{ x }}"),
      "312 outer");
  EXPECT_EQ(render("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");
  EXPECT_EQ(
      render("{% set ns = namespace(total=0, seen=[]) %}{% for i in l %}{% set ns.total = ns.total "
             "+ i %}{% set ns.seen = ns.seen + [i] %}{% endfor %}{{ ns.total }} {{ ns.seen }}"),
      "6 [3, 1, 2]");
  EXPECT_EQ(
      render("{% set ns = namespace() %}{% set ns.found = false %}{% for m in messages %}{% if "
             "m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}"),
      "True");
  // A namespace that holds itself: a reference cycle the renderer breaks when it ends (the
  // sanitizer configuration's leak check fails this test without that; bench/fuzz.sh found it).
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.a = (ns, 1) %}{% set ns.b = [ns] %}"
                   "{% for x in [ns] %}{% set ns.l = loop %}{% endfor %}{{ ns.a[1] }}"),
            "1");
  EXPECT_EQ(render("{% set block %}n={{ n }}{% endset %}[{{ block }}]"), "[n=7]");
  EXPECT_EQ(render("{% if messages[0]['role'] == 'system' %}{% set messages = messages[1:] %}{% "
                   "endif %}{{ messages | length }}"),
            "2");
}

TEST(JinjaTest, Macros) {
  EXPECT_EQ(render("{% macro tag(name, body='-', close=true) %}<{{ name }}>{{ body }}{% if close "
                   "%}</{{ name }}>{% endif %}{% endmacro %}{{ tag('a') }}{{ tag('b', 'x') }}{{ "
                   "tag('c', close=false) }}"),
            "<a>-</a><b>x</b><c>-");
  EXPECT_EQ(render("{% macro count(k) %}{% if k > 0 %}{{ k }}{{ count(k - 1) }}{% endif %}{% "
                   "endmacro %}{{ count(3) }}"),
            "321");
  EXPECT_EQ(render("{% macro show() %}[{{ n }}{{ i }}]{% endmacro %}{% for i in [1] %}{{ show() "
                   "}}{% endfor %}"),
            "[7]");
}

TEST(JinjaTest, Access) {
  EXPECT_EQ(render("{{ messages[0]['role'] }} {{ messages[0].role }} {{ messages[-1].role }} {{ "
                   "d['a'][1]['k'] }} {{ d.a.1.k }} [{{ d['zz'] }}] [{{ d.zz }}]"),
            "system system assistant v v [] []");
  EXPECT_EQ(render("{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[5:] }} "
                   "{{ messages[1:] | length }}"),
            "[1, 2] [3, 1] [2, 1, 3] [3, 2] [1, 2] [] 2");
  EXPECT_EQ(render("{{ s[2:7] }}|{{ 'héllo'[1:3] }}|{{ 'héllo'[::-1] }}|{{ 'abc'[-1] }}"),
            "Hello|él|olléh|c");
}

TEST(JinjaTest, Operators) {
  EXPECT_EQ(render("{{ n + 1 }} {{ n - 10 }} {{ n * 3 }} {{ n / 2 }} {{ n // 2 }} {{ n % 3 }} {{ "
                   "-n % 3 }} {{ -n // 2 }} {{ n ** 2 }} {{ 2 ** -1 }}"),
            "8 -3 21 3.5 3 1 2 -4 49 0.5");
  EXPECT_EQ(render("{{ x * 2 }} {{ x // 1 }} {{ -x // 1 }} {{ x % 1 }} {{ -7.5 % 2 }} {{ 1 / 3 }} "
                   "{{ 10 / 5 }}"),
            "5.0 2.0 -3.0 0.5 0.5 0.3333333333333333 2.0");
  EXPECT_EQ(render("{{ 'a' + 'b' }} {{ 'a' ~ n ~ none ~ true ~ x }} {{ l + [4] }} {{ 'ab' * 2 }} "
                   "{{ 2 * 3 ~ 4 }} {{ -2 ** 2 }}"),
            "ab a7NoneTrue2.5 [3, 1, 2, 4] abab 64 4");
  EXPECT_EQ(render("{{ n > 5 and n < 10 }} {{ n > 5 or 0 }} {{ 0 or '' }} {{ 0 and 1 }} {{ not n "
                   "}} {{ 1 < n < 10 }} {{ 1 == 1.0 }} {{ (1, 2) == [1, 2] }}"),
            "True True  0 False True True False");
  EXPECT_EQ(render("{{ 'ell' in 'hello' }} {{ 3 in l }} {{ 'b' in d }} {{ 'z' not in d }} {{ 'x' "
                   "in missing }}"),
            "True True True True False");
}

TEST(JinjaTest, Tests) {
  EXPECT_EQ(render("{{ missing is defined }} {{ n is defined }} {{ missing is undefined }} {{ none "
                   "is none }} {{ n is not none }}"),
            "False True True True True");
  EXPECT_EQ(render("{{ s is string }} {{ n is number }} {{ true is number }} {{ x is float }} {{ n "
                   "is integer }} {{ true is boolean }}"),
            "True True True True True True");
  EXPECT_EQ(render("{{ d is mapping }} {{ l is mapping }} {{ l is iterable }} {{ s is iterable }} "
                   "{{ n is iterable }} {{ l is sequence }}"),
            "True False True True False True");
  EXPECT_EQ(
      render(
          "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ "
          "'abc' is lower }} {{ 'ABC' is upper }} {{ 1 is in l }} {{ n is eq 7 }} {{ n is gt 3 }}"),
      "True False True False True True True True True");
}

TEST(JinjaTest, Filters) {
  EXPECT_EQ(render("[{{ s | trim }}] [{{ 'xxhixx' | trim('x') }}] {{ s | upper }} {{ s | lower }} "
                   "{{ 'hELLO wORLD' | capitalize }} {{ 'hello big-world (x)' | title }}"),
            "[Hello World] [hi]   HELLO WORLD     hello world   Hello world Hello Big-World (X)");
  EXPECT_EQ(render("{{ l | length }} {{ s | count }} {{ 'é😀' | length }} {{ d | length }} {{ "
                   "missing | length }}"),
            "3 15 2 2 0");
  EXPECT_EQ(render("{{ l | first }} {{ l | last }} {{ s | first }} {{ l | list }} {{ 'ab' | list "
                   "}} {{ l | reverse | list }} {{ 'abc' | reverse }}"),
            "3 2   [3, 1, 2] ['a', 'b'] [2, 1, 3] cba");
  EXPECT_EQ(
      render("{{ l | join }} {{ l | join(', ') }} {{ messages | join('/', attribute='role') }}"),
      "312 3, 1, 2 system/user/assistant");
  EXPECT_EQ(
      render("[{{ missing | default('dflt') }}] [{{ empty | default('e', true) }}] [{{ empty | "
             "d('e2', boolean=true) }}] [{{ none | default('x') }}] [{{ missing | default }}]"),
      "[dflt] [e] [e2] [None] []");
  EXPECT_EQ(
      render("{{ n | string }} {{ '42' | int + 1 }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | "
             "int(5) }} {{ '3.25' | float }} {{ n | float }} {{ -3 | abs }} {{ -n | abs }}"),
      "7 43 4 0 5 3.25 7.0 3 7");
  EXPECT_EQ(render("{{ 2.5 | round }} {{ 3.14159 | round(2) }} {{ 3.1 | round(0, 'ceil') }} {{ 7 | "
                   "round }}"),
            "2.0 3.14 4.0 7");
  EXPECT_EQ(render("{{ 'hello' | replace('l', 'L') }} {{ 'hello' | replace('l', 'L', 1) }} {{ "
                   "['A', 'a', 'b', 'A'] | unique | list }} {{ d | items | list }}"),
            "heLLo heLlo ['A', 'b'] [('b', 1), ('a', [1, {'k': 'v'}])]");
  EXPECT_EQ(render("{{ 'line1\\nline2\\n\\nline3' | indent(2) }}|{{ 'l1\\nl2' | indent(2, true) "
                   "}}|{{ 'l1\\n\\nl2' | indent(width='> ', blank=true) }}"),
            "line1\n  line2\n\n  line3|  l1\n  l2|l1\n> \n> l2");
  EXPECT_EQ(render("{{ messages | map(attribute='role') | list }} {{ ['a', 'B'] | map('upper') | "
                   "list }} {{ messages | map(attribute='name', default='-') | list }}"),
            "['system', 'user', 'assistant'] ['A', 'B'] ['-', '-', '-']");
  EXPECT_EQ(render("{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ "
                   "messages | rejectattr('role', 'eq', 'user') | map(attribute='role') | "
                   "join(',') }} {{ messages | selectattr('tool_calls') | list | length }}"),
            "1 system,assistant 1");
  EXPECT_EQ(render("{{ [1, 2, 3] | select('odd') | list }} {{ [1, 2, 3] | reject('odd') | list }} "
                   "{{ [0, 1, '', 'a'] | select | list }}"),
            "[1, 3] [2] [1, 'a']");
}

TEST(JinjaTest, ToJson) {
  EXPECT_EQ(render("{{ d | tojson }}"), "{\"b\": 1, \"a\": [1, {\"k\": \"v\"}]}");
  EXPECT_EQ(render("{{ d | tojson(indent=2) }}"),
            "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    {\n      \"k\": \"v\"\n    }\n  ]\n}");
  EXPECT_EQ(render("{{ messages[1] | tojson }} {{ messages[1] | tojson(ensure_ascii=true) }}"),
            "{\"role\": \"user\", \"content\": \"Hi é 😀\"} {\"role\": \"user\", \"content\": \"Hi "
            "\\u00e9 \\ud83d\\ude00\"}");
  EXPECT_EQ(
      render("{{ d | tojson(sort_keys=true) }} {{ d | tojson(separators=(',', ':')) }} {{ {'a': "
             "[]} | tojson(indent=0) }}"),
      "{\"a\": [1, {\"k\": \"v\"}], \"b\": 1} {\"b\":1,\"a\":[1,{\"k\":\"v\"}]} {\n\"a\": []\n}");
  EXPECT_EQ(render("{{ messages[2].tool_calls[0].function.arguments | tojson(indent=4) }}"),
            "{\n    \"a\": 1,\n    \"b\": [\n        1.5,\n        null,\n        true\n    ]\n}");
  EXPECT_EQ(render("{{ 'quote \" backslash \\\\ tab \\t ctrl \\x01' | tojson }} {{ 1.0 | tojson }} "
                   "{{ (1, 2) | tojson }}"),
            "\"quote \\\" backslash \\\\ tab \\t ctrl \\u0001\" 1.0 [1, 2]");
}

TEST(JinjaTest, MethodsAndGlobals) {
  EXPECT_EQ(render("[{{ s.strip() }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] [{{ "
                   "'xxhixx'.strip('x') }}] [{{ '\\u3000 wide\\u00a0'.strip() }}]"),
            "[Hello World] [Hello World  ] [  Hello World] [hi] [wide]");
  EXPECT_EQ(render("{{ s.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ "
                   "'a,b,c'.rsplit(',', 1) }} {{ '  a  b '.split(None, 1) }}"),
            "['Hello', 'World'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['a,b', 'c'] ['a', 'b ']");
  EXPECT_EQ(render("{{ s.startswith('  He') }} {{ s.endswith('d  ') }} {{ s.startswith(('x', ' ')) "
                   "}} {{ s.find('World') }} {{ 'é x'.find('x') }} {{ s.count('l') }}"),
            "True True True 8 2 3");
  EXPECT_EQ(render("{{ s.upper() }} {{ s.lower() }} {{ 'hello world'.title() }} {{ "
                   "'hELLO'.capitalize() }} {{ s.replace('l', 'L') }} {{ '-'.join(['a', 'b']) }}"),
            "  HELLO WORLD     hello world   Hello World Hello   HeLLo WorLd   a-b");
  EXPECT_EQ(render("{{ 'ÉCOLE straße'.lower() }} {{ 'straße'.upper() }} {{ 'ΟΔΟΣ'.lower() }} {{ "
                   "'việt nam'.upper() }} {{ 'привет'.upper() }}"),
            "école straße STRASSE οδος VIỆT NAM ПРИВЕТ");
  EXPECT_EQ(render("{{ d.get('b') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.keys() | list }} "
                   "{{ d.values() | list }} {{ d.items() | list }}"),
            "1 None 5 ['b', 'a'] [1, [1, {'k': 'v'}]] [('b', 1), ('a', [1, {'k': 'v'}])]");
  EXPECT_EQ(render("{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list "
                   "}} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }}"),
            "[0, 1, 2] [1, 4, 7] [5, 3, 1] {'a': 1, 'b': 'x'} 1");
}
TEST(JinjaTest, PythonObjects) {
  // What filters and methods return behaves like the Python object Jinja2 has: a generator
  // (map, select, items, ...) is always true and has no length; range and dict views print as
  // Python prints them; a method read without calling it is a (true, callable) method, never a
  // dict key of the same name.
  EXPECT_EQ(render("{% if messages | selectattr('role', 'eq', 'nobody') %}T{% else %}F{% endif %}"
                   "{% if messages | selectattr('role', 'eq', 'nobody') | list %}T{% else %}F"
                   "{% endif %}"),
            "TF");
  EXPECT_EQ(render("{{ range(3) }} {{ d.items() }} {{ d.keys() }} {{ range(1, 7, 2) }}"),
            "range(0, 3) dict_items([('b', 1), ('a', [1, {'k': 'v'}])]) dict_keys(['b', 'a']) "
            "range(1, 7, 2)");
  EXPECT_EQ(render("{{ 'yes' if s.strip else 'no' }} {{ s.strip is callable }} "
                   "{{ {'items': 5}['items'] }} {{ {'items': 5}.items is callable }} "
                   "{{ {'a': 1}.pop is defined }}"),
            "yes True 5 True False");
  EXPECT_EQ(render("{% for x in l %}{{ loop }}{% endfor %} {{ (l | map('string'))[0] }}|"
                   "{{ range(5)[-1] }}"),
            "<LoopContext 1/3><LoopContext 2/3><LoopContext 3/3> |4");
  // Where Jinja2 raises, so do we; where it prints a memory address, we refuse.
  for (const char* source :
       {"{{ l | select | length }}", "{{ l | reverse | last }}", "{{ range(3) + [1] }}",
        "{{ l | map('string') }}", "{{ s.strip }}", "{{ range }}",
        // Jinja2 would see a used generator as empty, or half used.
        "{% set g = l | map('string') %}{{ g | join }}{{ g | join }}",
        "{% set g = l | select %}{{ g | first }}{% for x in g %}{{ x }}{% endfor %}"})
    EXPECT_NE(error_of(source), "") << source;
}

TEST(JinjaTest, UnsupportedConstructsFailAtParseNamingThemAndTheLine) {
  struct Case {
    const char* source;
    const char* mentions;
  };
  const Case cases[] = {
      {"{% include 'other.jinja' %}", "unsupported tag '{% include %}'"},
      {"{% extends 'base' %}", "unsupported tag '{% extends %}'"},
      {"{% raw %}x{% endraw %}", "unsupported tag '{% raw %}'"},
      {"{% frobnicate %}", "unknown tag '{% frobnicate %}'"},
      {"{% endif %}", "'{% endif %}'"},
      {"{{ x | wordwrap }}", "unsupported filter 'wordwrap'"},
      {"{{ x | map('nosuch') }}", "unsupported filter 'nosuch'"},
      {"{{ x is sameas y }}", "unsupported test 'sameas'"},
      {"{{ x | select('nosuch') }}", "unsupported test 'nosuch'"},
      {"{{ lipsum() }}", "unknown function 'lipsum()'"},
      {"{{ messages.append(1) }}", "unsupported method '.append()'"},
      {"{% for x in l recursive %}{% endfor %}", "recursive"},
      {"{% macro m() %}{{ caller() }}{% endmacro %}", "unknown function 'caller()'"},
      {"{{ f(*args) }}", "*args"},
  };
  for (const auto& c : cases) {
    const std::string source = std::string("line one\n") + c.source;
    try {
      Template t(source);
      ADD_FAILURE() << "parsed: " << source;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("line 2"), std::string::npos) << what;
      EXPECT_NE(what.find(c.mentions), std::string::npos) << what;
    }
  }
}

TEST(JinjaTest, SyntaxErrorsFailAtParse) {
  for (const char* source : {"{% if x %}never closed",
                             "{% for x in l %}",
                             "{{ 'unterminated }}",
                             "{{ 1 + }}",
                             "{{ (1 }}",
                             "{{ }}",
                             "{% if %}x{% endif %}",
                             "{% break %}",
                             "{{ 007 }}",
                             "{# open",
                             "{{ x",
                             "{% set %}",
                             "{{ 'a' | }}",
                             "{{ x is }}",
                             "{% for in l %}{% endfor %}",
                             "{{ 1 if true else }}",
                             "{% macro m( %}{% endmacro %}",
                             "{{ a.b.(c) }}",
                             "{{ '\\N{DASH}' }}",
                             "{% for a, in l %}{% endfor %}",
                             "{% set none = 1 %}",
                             "{% for true in l %}{% endfor %}"}) {
    EXPECT_THROW(Template{source}, Error) << source;
  }
  // The line of an unclosed block is the line that opened it.
  EXPECT_NE(error_of("a\nb\n{% for x in l %}\nc").find("line 3"), std::string::npos);
  EXPECT_NE(error_of("a\n{{ 1 +\n }}").find("line 3"), std::string::npos);
}

TEST(JinjaTest, RuntimeErrorsThrow) {
  // Where Jinja2 raises while rendering, so do we: an undefined value used as an object or in
  // arithmetic, type errors, division by zero, a dict assigned like a namespace.
  for (const char* source : {"{{ missing.attr }}",
                             "{{ missing['k'] }}",
                             "{{ missing + 1 }}",
                             "{{ 'a' + 1 }}",
                             "{{ 1 / 0 }}",
                             "{{ n // 0 }}",
                             "{{ none < 1 }}",
                             "{{ missing | tojson }}",
                             "{% set d2 = {} %}{% set d2.x = 1 %}",
                             "{{ 1 in 'abc' }}",
                             "{% for x in n %}{% endfor %}",
                             "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
                             "{{ missing.strip() }}",
                             "{{ l.strip() }}",
                             "{{ range(1000000) | length }}",
                             "{{ 2 ** 64 }}",
                             "{{ 'a' % 1 }}",
                             "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
                             "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}",
                             "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
                             "{{ range(3) | tojson }}"}) {
    const std::string what = error_of(source);
    EXPECT_NE(what, "") << source;
    EXPECT_EQ(what.rfind("template line 1: ", 0), 0u) << what;
  }
}

TEST(JinjaTest, PathologicalTemplatesAreErrorsNotCrashes) {
  EXPECT_THROW(Template("{{ " + std::string(2000, '(') + "1" + std::string(2000, ')') + " }}"),
               Error);
  EXPECT_THROW(Template("{{ " + std::string(2000, '-') + "1 }}"), Error);
  std::string blocks;
  for (int k = 0; k < 2000; ++k) blocks += "{% if true %}";
  for (int k = 0; k < 2000; ++k) blocks += "{% endif %}";
  EXPECT_THROW(Template{blocks}, Error);
  const ojson deep = ojson::parse(std::string(5000, '[') + std::string(5000, ']'));
  EXPECT_THROW(render("{{ x }}", ojson{{"x", deep}}), Error);
  EXPECT_NE(error_of("{% set ns = namespace(x=[]) %}{% for i in range(2000) %}"
                     "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"),
            "");
  EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}"), "");
  EXPECT_NE(error_of("{{ 'x' | indent(1000000000000) }}"), "");
  EXPECT_NE(error_of("{{ l | tojson(indent=1000000000) }}"), "");
  EXPECT_NE(error_of("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
            "");
  // Ordinary nesting is fine.
  EXPECT_EQ(render("{{ ((((((1 + 2)))))) }}{% if true %}{% for i in [1] %}{% if i %}"
                   "{% for j in [2] %}{{ i ~ j }}{% endfor %}{% endif %}{% endfor %}{% endif %}"),
            "312");
}

TEST(JinjaTest, RaiseExceptionCarriesTheTemplatesMessage) {
  EXPECT_EQ(error_of("{{ raise_exception('roles must alternate') }}"), "roles must alternate");
  EXPECT_EQ(error_of("{% if n > 5 %}{{ raise_exception('n is ' ~ n) }}{% endif %}"), "n is 7");
}

TEST(JinjaTest, StrftimeNowFormatsTheLocalTime) {
  const std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
  EXPECT_EQ(render("{{ strftime_now is defined }}"), "True");
}

TEST(JinjaTest, KeepsTheContextsKeyOrder) {
  const ojson ctx = ojson::parse(R"({"tool": {"name": "f", "description": "d", "a": 1}})");
  EXPECT_EQ(render("{{ tool | tojson }} {% for k in tool %}{{ k }}{% endfor %}", ctx),
            "{\"name\": \"f\", \"description\": \"d\", \"a\": 1} namedescriptiona");
}

TEST(JinjaTest, RenderIsThreadSafe) {
  const Template t(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.role | upper }}{% endfor %}{{ ns.n }}");
  std::vector<std::thread> threads;
  std::vector<std::string> out(8);
  for (size_t k = 0; k < out.size(); ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 200; ++r) out[k] = t.render(context());
    });
  for (auto& th : threads) th.join();
  for (const auto& o : out) EXPECT_EQ(o, "SYSTEMUSERASSISTANT3");
}

TEST(JinjaTest, InvalidUtf8PassesThroughUnchanged) {
  const ojson ctx = {{"s", std::string("a\xff"
                                       "b")}};
  EXPECT_EQ(render("{{ s }}|{{ s | length }}|{{ s[::-1] }}", ctx),
            "a\xff"
            "b|3|b\xff"
            "a");
}

}  // namespace
}  // namespace blend::jinja
