// Fuzzes a Batch API input file as `blend batch` and POST /v1/batches read it: the bytes are the
// JSONL file; every line goes through read_batch_input and prepare_batch_line with the real
// Llama-3 tokenizer and chat template. A bad line must become that line's error result, never
// an exception out of the batch (that would abort a whole job) or a crash. A file-wide error
// (unreadable, duplicate custom_ids) is a blend::Error, as the CLI reports it.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "api/batch_file.h"
#include "api/openai.h"
#include "core/error.h"
#include "fuzz_file.h"
#include "fuzz_tokenizer.h"

namespace {

// max_prompt_bytes walks the vocabulary: once per process, not per input.
const blend::BatchLineContext& line_context() {
  static const blend::BatchLineContext context = [] {
    blend::BatchLineContext c;
    c.max_sequence_tokens = 4096;
    const blend::Tokenizer& tokenizer = blend::fuzz::llama3_tokenizer();
    c.models = {{.name = "tiny",
                 .chat_template = &blend::fuzz::llama3_chat_template(),
                 .tokenizer = &tokenizer,
                 .grammars = &blend::fuzz::llama3_grammars(),
                 .max_prompt_bytes = blend::max_prompt_bytes(tokenizer, c.max_sequence_tokens)}};
    return c;
  }();
  return context;
}

}  // namespace

// Before libFuzzer's clock starts (see fuzz_tokenizer.h).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)line_context();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = blend::fuzz::write_input("batch.jsonl", data, size);
  const blend::BatchLineContext& context = line_context();
  std::vector<blend::BatchInputLine> lines;
  try {
    lines = blend::read_batch_input(path);
  } catch (const blend::Error&) {
    return 0;
  }
  for (const blend::BatchInputLine& line : lines) {
    // No exception may leave prepare_batch_line: each line's failure is its own result.
    const blend::PreparedBatchLine prepared = blend::prepare_batch_line(line, context);
    if (prepared.error) continue;
    // An accepted line is runnable: a prompt of valid ids that fits the context, and the
    // custom_id it was read with.
    const auto& prompt = prepared.generation.prompt;
    bool ok = !prompt.empty() &&
              static_cast<int64_t>(prompt.size()) < context.max_sequence_tokens &&
              prepared.custom_id == line.custom_id;
    // (Ids past the vocabulary are the engine's to refuse, against the model's vocab_size.)
    for (int32_t id : prompt) ok = ok && id >= 0;
    if (!ok) {
      std::fprintf(stderr, "batch_lines_fuzz: line %lld accepted but not runnable\n",
                   static_cast<long long>(line.line_number));
      std::abort();
    }
  }
  return 0;
}
