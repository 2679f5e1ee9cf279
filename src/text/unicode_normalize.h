// Unicode normalization forms NFC, NFD, NFKC and NFKD (UAX #15), as the tokenizer.json
// normalizers of the same names apply them (Hugging Face tokenizers: the unicode-normalization
// crate; transformers.js: String.prototype.normalize).
//
// The tables come from the Unicode Character Database of the Debian package unicode-data,
// turned into code by scripts/gen_unicode_norm.py at build time: combining classes, full
// decompositions, primary composites (composition exclusions removed), and the quick-check
// properties. Hangul syllables are decomposed and composed algorithmically.
//
// Input that is not valid UTF-8 is not refused: each ill-formed byte is kept as it is, and acts
// as a starter that composes with nothing (so the tokenizer still turns it into its byte token).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace blend::tok {

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

// The name tokenizer.json gives the form ("NFC", ...), or nullopt for any other string.
std::optional<NormalForm> normal_form_named(std::string_view name);

// True when `text` is already in `form` by the quick-check (UAX #15 §9) with Maybe taken as No:
// a scan over the code points with no allocation; ASCII text passes at once.
bool is_normalized_quick(std::string_view text, NormalForm form);

// `text` in `form`. Equal to `text` when is_normalized_quick(text, form).
std::string normalize(std::string_view text, NormalForm form);

}  // namespace blend::tok
