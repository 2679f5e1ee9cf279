// blend tokenize — text on stdin -> JSON array of ids; --decode: ids -> text.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "api/json_limits.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace blend::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  bool add_bos = false;
  bool decode = false;
  bool no_special = false;
};

void run_tokenize(const TokenizeArgs& a) {
  const Tokenizer tok = Tokenizer::from_dir(a.model);
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  if (a.decode) {
    nlohmann::json ids;
    try {
      ids = parse_client_json(input, "stdin");
    } catch (const Error&) {
      throw Error("--decode expects a JSON array of token ids on stdin");
    }
    if (!ids.is_array()) throw Error("--decode expects a JSON array of token ids on stdin");
    std::vector<int32_t> v;
    for (const auto& x : ids) {
      if (!x.is_number_integer()) throw Error("--decode: token ids must be integers");
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= tok.vocab_size())
        throw Error("--decode: token id " + std::to_string(id) + " is out of range [0, " +
                    std::to_string(tok.vocab_size()) + ")");
      v.push_back(static_cast<int32_t>(id));
    }
    const std::string text = tok.decode(v);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::vector<int32_t> ids;
  if (a.add_bos) {
    const auto bos = tok.token_id(tok.bos_token());
    if (!bos) throw Error("--add-bos: the tokenizer names no BOS token");
    ids.push_back(*bos);
  }
  const auto body = tok.encode(input, !a.no_special);
  ids.insert(ids.end(), body.begin(), body.end());
  std::printf("%s\n", nlohmann::json(ids).dump().c_str());
}

}  // namespace

void register_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Text on stdin -> JSON token ids (or back)");
  cmd->add_option("--model", args->model, "Model folder or GGUF file (tokenizer.json)")
      ->transform(model_source_transform())
      ->required();
  cmd->add_flag("--add-bos", args->add_bos, "Prepend the BOS token");
  cmd->add_flag("--decode", args->decode, "Read a JSON array of ids and print the text");
  cmd->add_flag("--no-special", args->no_special, "Treat special-token text as plain text");
  cmd->callback([args] { run_tokenize(*args); });
}

}  // namespace blend::cli
