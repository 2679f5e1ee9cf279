// The Unicode normalization forms against the conformance file of the Unicode Character
// Database the tables were generated from (NormalizationTest.txt of the Debian package
// unicode-data): every line's five columns, and every code point that part 1 does not list
// (those are invariant under all four forms).
#include "text/unicode_normalize.h"

#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "test_util.h"

namespace blend::tok {
namespace {

std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

// "0044 0307" -> UTF-8.
std::string column(const std::string& hex) {
  std::istringstream in(hex);
  std::string out, word;
  while (in >> word) out += utf8(static_cast<uint32_t>(std::stoul(word, nullptr, 16)));
  return out;
}

TEST(UnicodeNormalize, PassesTheUnicodeConformanceTest) {
  testing::TempDir dir;
  const auto file = dir / "NormalizationTest.txt";
  const auto r = testing::run_command("bzcat /usr/share/unicode/NormalizationTest.txt.bz2 > '" +
                                      file.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << "needs the Debian package unicode-data (scripts/setup.sh)";
  std::istringstream lines(testing::read_file(file));
  std::string line;
  bool part1 = false;
  std::set<uint32_t> listed_in_part1;
  size_t cases = 0, failures = 0;
  while (std::getline(lines, line) && failures < 20) {
    if (line.rfind("@Part", 0) == 0) part1 = line.rfind("@Part1", 0) == 0;
    if (line.empty() || line[0] == '#' || line[0] == '@') continue;
    std::vector<std::string> c;
    std::istringstream fields(line);
    for (std::string f; c.size() < 5 && std::getline(fields, f, ';');) c.push_back(column(f));
    ASSERT_EQ(c.size(), 5u) << line;
    if (part1) listed_in_part1.insert(static_cast<uint32_t>(std::stoul(line, nullptr, 16)));
    ++cases;
    const size_t before = failures;
    for (int k = 0; k < 5; ++k) {
      // UAX #15's invariants: NFC and NFD of columns 1-3 are columns 2 and 3, of 4-5 columns 4
      // and 5; NFKC and NFKD of every column are columns 4 and 5.
      const bool canonical = k < 3;
      failures += normalize(c[k], NormalForm::kNFC) != c[canonical ? 1 : 3];
      failures += normalize(c[k], NormalForm::kNFD) != c[canonical ? 2 : 4];
      failures += normalize(c[k], NormalForm::kNFKC) != c[3];
      failures += normalize(c[k], NormalForm::kNFKD) != c[4];
    }
    // Within longer text (only the failing segment is normalized, the rest copied): a space is
    // a starter that composes with nothing, so the column normalizes alone.
    failures += normalize("a " + c[0] + " z", NormalForm::kNFC) != "a " + c[1] + " z";
    failures += normalize("a " + c[0] + " z", NormalForm::kNFKD) != "a " + c[4] + " z";
    EXPECT_EQ(failures, before) << line;
  }
  EXPECT_GT(cases, 19000u);
  EXPECT_GT(listed_in_part1.size(), 10000u);
  for (uint32_t cp = 0; cp < 0x110000 && failures < 20; ++cp) {
    if ((cp >= 0xD800 && cp < 0xE000) || listed_in_part1.count(cp)) continue;
    const std::string s = utf8(cp);
    for (const NormalForm f :
         {NormalForm::kNFC, NormalForm::kNFD, NormalForm::kNFKC, NormalForm::kNFKD}) {
      const bool same = normalize(s, f) == s;
      EXPECT_TRUE(same) << "U+" << std::hex << cp << " form " << static_cast<int>(f);
      failures += !same;
    }
  }
}

TEST(UnicodeNormalize, QuickCheckPassesNormalizedTextAndCatchesTheRest) {
  EXPECT_TRUE(is_normalized_quick("plain ASCII text\n", NormalForm::kNFC));
  EXPECT_TRUE(is_normalized_quick("caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd", NormalForm::kNFC));
  EXPECT_FALSE(is_normalized_quick("e\xcc\x81", NormalForm::kNFC));  // e + U+0301
  EXPECT_FALSE(is_normalized_quick("caf\xc3\xa9", NormalForm::kNFD));
  EXPECT_FALSE(is_normalized_quick("\xef\xac\x81", NormalForm::kNFKC));  // U+FB01 fi ligature
  EXPECT_TRUE(is_normalized_quick("\xef\xac\x81", NormalForm::kNFC));
  // Out of canonical order: U+0301 (class 230) before U+0323 (class 220).
  EXPECT_FALSE(is_normalized_quick("a\xcc\x81\xcc\xa3", NormalForm::kNFD));
}

TEST(UnicodeNormalize, KeepsIllFormedBytesAsTheyAre) {
  // 0xFF and a lone continuation byte around e + U+0301: the bytes stay, the pair composes.
  EXPECT_EQ(normalize("\xff"
                      "e\xcc\x81\x80",
                      NormalForm::kNFC),
            "\xff\xc3\xa9\x80");
  // A combining mark after an ill-formed byte does not compose with it.
  EXPECT_EQ(normalize("\xff\xcc\x81", NormalForm::kNFC), "\xff\xcc\x81");
  EXPECT_EQ(normalize("\xc3\xa9\xff", NormalForm::kNFD), "e\xcc\x81\xff");
}

TEST(UnicodeNormalize, NamesTheFormsOfTokenizerJson) {
  EXPECT_EQ(normal_form_named("NFKD"), NormalForm::kNFKD);
  EXPECT_EQ(normal_form_named("NFC"), NormalForm::kNFC);
  EXPECT_FALSE(normal_form_named("nfc").has_value());
}

}  // namespace
}  // namespace blend::tok
