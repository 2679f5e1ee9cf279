#include "blocks/equivalence.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/forward_batch.h"

namespace blend {
double probability_cosine(const float* x, const float* y, int64_t n, float* scratch) {
  const float mx = *std::max_element(x, x + n), my = *std::max_element(y, y + n);
  // The softmax normalisers cancel in the cosine: cos(exp(x - mx), exp(y - my)) is the answer.
  double dot = 0, nx = 0, ny = 0;
  for (int64_t i = 0; i < n; ++i) scratch[i] = cpu::exp_approx(x[i] - mx);
  for (int64_t i = 0; i < n; ++i) {
    const double ey = cpu::exp_approx(y[i] - my), ex = scratch[i];
    dot += ex * ey;
    nx += ex * ex;
    ny += ey * ey;
  }
  return dot / std::sqrt(nx * ny);
}

TopTokenAndKl top_token_and_kl(const float* lp, const float* lq, int64_t n) {
  // KL(P || Q) = sum_i P_i (log P_i - log Q_i), from both rows' log-softmax (sums in double);
  // the top token of each is its first maximum, as greedy sampling picks it.
  const int64_t ip = std::max_element(lp, lp + n) - lp, iq = std::max_element(lq, lq + n) - lq;
  const double mp = lp[ip], mq = lq[iq];
  double zp = 0, zq = 0;
  for (int64_t i = 0; i < n; ++i) {
    zp += std::exp(static_cast<double>(lp[i]) - mp);
    zq += std::exp(static_cast<double>(lq[i]) - mq);
  }
  const double lsp = mp + std::log(zp), lsq = mq + std::log(zq);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double log_p = lp[i] - lsp;
    kl += std::exp(log_p) * (log_p - (lq[i] - lsq));
  }
  return {ip == iq, std::max(0.0, kl)};
}

const char* layer_block_name(LayerBlock block) {
  return block == LayerBlock::kAttention ? "attention" : "ffn";
}

int64_t similarity_pages(const std::vector<std::vector<TokenId>>& prompts, int64_t page_size) {
  int64_t pages = 0;
  for (const auto& p : prompts)
    pages += 2 * ((static_cast<int64_t>(p.size()) + page_size - 1) / page_size);
  return pages;
}

namespace {

void check_prompts(const CpuBackend& backend, int64_t page_size,
                   const std::vector<std::vector<TokenId>>& prompts, const char* what) {
  if (prompts.empty()) throw Error(std::string(what) + ": no calibration prompt");
  for (const auto& p : prompts)
    if (p.empty()) throw Error(std::string(what) + ": an empty calibration prompt");
  if (similarity_pages(prompts, page_size) > backend.num_pages())
    throw Error(std::string(what) + ": the calibration prompts need " +
                std::to_string(similarity_pages(prompts, page_size)) +
                " KV pages, the backend has " + std::to_string(backend.num_pages()));
}

// Runs models x and y over every prompt, one token a step so every position's logits come out,
// and calls measure(x's logits, y's logits, scratch of vocab floats) for each position, in
// parallel over a step's positions; returns the measures in a fixed order (prompt by prompt
// within a position, positions in order), so any reduction of them is deterministic.
template <typename Measure>
std::vector<Measure> paired_positions(
    CpuBackend& backend, int64_t page_size, ModelId x, ModelId y,
    const std::vector<std::vector<TokenId>>& prompts,
    const std::function<Measure(const float*, const float*, float*)>& measure) {
  struct Seq {
    const std::vector<TokenId>* tokens;
    ModelId model;
    std::vector<PageId> pages;
  };
  std::vector<Seq> seqs;
  PageId next = 0;
  size_t longest = 0;
  for (const auto& p : prompts) {
    longest = std::max(longest, p.size());
    for (ModelId chain : {x, y}) {
      Seq s{&p, chain, {}};
      for (size_t i = 0; i * static_cast<size_t>(page_size) < p.size(); ++i)
        s.pages.push_back(next++);
      seqs.push_back(std::move(s));
    }
  }
  const int64_t vocab = backend.config().vocab_size;
  std::vector<float> logits, scratch;
  std::vector<Measure> out;
  for (size_t t = 0; t < longest; ++t) {
    ForwardBatch batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].tokens->size() <= t) continue;
      SeqChunk c;
      c.seq = static_cast<SeqId>(i + 1);
      c.num_cached = static_cast<int32_t>(t);
      c.num_tokens = 1;
      c.token_offset = batch.num_tokens();
      c.block_table = seqs[i].pages;
      c.wants_logits = true;
      c.model = seqs[i].model;
      batch.tokens.push_back((*seqs[i].tokens)[t]);
      batch.positions.push_back(static_cast<int32_t>(t));
      batch.chunks.push_back(std::move(c));
    }
    logits.resize(batch.chunks.size() * static_cast<size_t>(vocab));
    backend.forward(batch, logits);
    // Rows come in pairs: x's, then y's, of one prompt.
    const auto pairs = static_cast<int64_t>(batch.chunks.size() / 2);
    scratch.resize(static_cast<size_t>(pairs * vocab));
    const size_t first = out.size();
    out.resize(first + static_cast<size_t>(pairs));
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < pairs; ++p)
      out[first + static_cast<size_t>(p)] =
          measure(logits.data() + 2 * p * vocab, logits.data() + (2 * p + 1) * vocab,
                  scratch.data() + p * vocab);
  }
  return out;
}

}  // namespace

double block_similarity(CpuBackend& backend, int64_t page_size, ModelId a, ModelId b, int64_t layer,
                        LayerBlock block, const std::vector<std::vector<TokenId>>& prompts) {
  check_prompts(backend, page_size, prompts, "block similarity");
  // Both chains are a's up to the block; one of them runs b's block there. The head is a's.
  ChainSpec reference{.base = a,
                      .attention = std::vector<ModelId>(static_cast<size_t>(layer + 1), a),
                      .ffn = std::vector<ModelId>(
                          static_cast<size_t>(block == LayerBlock::kFfn ? layer + 1 : layer), a)};
  ChainSpec swapped = reference;
  (block == LayerBlock::kAttention ? swapped.attention : swapped.ffn).back() = b;
  const ModelId x = backend.add_chain(reference), y = backend.add_chain(swapped);
  const int64_t vocab = backend.config().vocab_size;
  const std::vector<double> cosines = paired_positions<double>(
      backend, page_size, x, y, prompts, [vocab](const float* lx, const float* ly, float* scratch) {
        return probability_cosine(lx, ly, vocab, scratch);
      });
  double sum = 0;
  for (double c : cosines) sum += c;
  return sum / static_cast<double>(cosines.size());
}

ChainDivergence chain_divergence(CpuBackend& backend, int64_t page_size, ModelId original,
                                 ModelId other, const std::vector<std::vector<TokenId>>& prompts) {
  check_prompts(backend, page_size, prompts, "chain divergence");
  const int64_t vocab = backend.config().vocab_size;
  const std::vector<TopTokenAndKl> positions =
      paired_positions<TopTokenAndKl>(backend, page_size, original, other, prompts,
                                      [vocab](const float* lp, const float* lq, float*) {
                                        return top_token_and_kl(lp, lq, vocab);
                                      });
  ChainDivergence d;
  d.positions = static_cast<int64_t>(positions.size());
  for (const TopTokenAndKl& p : positions) {
    d.agreement += p.same_top ? 1 : 0;
    d.kl += p.kl;
  }
  d.agreement /= static_cast<double>(d.positions);
  d.kl /= static_cast<double>(d.positions);
  return d;
}

std::vector<BlockSimilarity> compare_blocks(CpuBackend& backend, int64_t page_size, ModelId a,
                                            ModelId b,
                                            const std::vector<std::vector<TokenId>>& prompts) {
  std::vector<BlockSimilarity> out;
  for (int64_t layer = 0; layer < backend.config().num_layers; ++layer)
    for (LayerBlock block : {LayerBlock::kAttention, LayerBlock::kFfn}) {
      BlockSimilarity s{.layer = layer, .block = block};
      s.identical = backend.shares_block(a, b, layer, block);
      if (!s.identical)
        s.similarity = block_similarity(backend, page_size, a, b, layer, block, prompts);
      out.push_back(s);
    }
  return out;
}

std::vector<std::string> default_calibration_prompts() {
  return {
      "The history of the city begins with a small fishing village on the river, where traders "
      "from the north came each spring to exchange furs for salt and grain.",
      "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    "
      "return a\n",
      "User: Can you explain why the sky is blue?\nAssistant: Sunlight is scattered by the "
      "molecules of the air, and shorter wavelengths scatter more strongly.",
      "To make the sauce, melt the butter over low heat, whisk in the flour, and add the warm "
      "milk a little at a time until it thickens.",
      "In 1905 Einstein published four papers that changed physics: on the photoelectric "
      "effect, Brownian motion, special relativity and the equivalence of mass and energy.",
      "SELECT name, COUNT(*) AS orders FROM customers JOIN orders ON customers.id = "
      "orders.customer_id GROUP BY name ORDER BY orders DESC LIMIT 10;",
      "Dear team, the release is moved to Thursday because the load tests found a memory leak "
      "in the cache; please review the fix before Wednesday noon.",
      "The theorem states that every bounded monotone sequence of real numbers converges, and "
      "the proof uses the least upper bound property.",
  };
}

}  // namespace blend
