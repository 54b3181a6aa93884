#include "bench/matched_trace.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"

namespace hicache {
namespace {

// Uniform in (0, 1], from 53 random bits.
double Uniform(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
}

// A standard normal draw (Box-Muller, one of the pair).
double Normal(std::mt19937_64& rng) {
  const double u = Uniform(rng);
  const double v = Uniform(rng);
  return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
}

// Log-normal block count of the given median, at least one.
int64_t LogNormalBlocks(std::mt19937_64& rng, double median, double sigma) {
  const double x = median * std::exp(sigma * Normal(rng));
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(x)));
}

// Zipf over ranks 0 .. n-1 by inverse CDF.
class Zipf {
 public:
  Zipf(int64_t n, double s) : cdf_(n) {
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      sum += std::pow(static_cast<double>(k + 1), -s);
      cdf_[k] = sum;
    }
    for (double& c : cdf_) c /= sum;
  }
  int64_t operator()(std::mt19937_64& rng) const {
    const double u = Uniform(rng);
    return std::min<int64_t>(
        std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin(),
        static_cast<int64_t>(cdf_.size()) - 1);
  }

 private:
  std::vector<double> cdf_;
};

struct Session {
  std::vector<int64_t> ids;  // The last input's blocks.
  int64_t turns_left = 0;    // 0: the slot starts a fresh session.
};

}  // namespace

absl::Status ValidateMatchedTraceOptions(const MatchedTraceOptions& o) {
  auto bad = [](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("matched trace: ", what));
  };
  if (o.requests < 0) return bad("requests < 0");
  if (o.slots < 1) return bad("slots < 1");
  if (o.slot_zipf_s < 0 || o.system_zipf_s < 0) return bad("zipf exponent < 0");
  if (!(o.mean_turns >= 2)) return bad("mean_turns < 2");
  if (o.one_shot_p < 0 || o.one_shot_p > 1) {
    return bad("one_shot_p outside [0, 1]");
  }
  if (o.system_prompt_p < 0 || o.system_prompt_p > 1) {
    return bad("system_prompt_p outside [0, 1]");
  }
  if (o.system_prompts < 1) return bad("system_prompts < 1");
  if (o.system_min_blocks < 1 || o.system_max_blocks < o.system_min_blocks) {
    return bad("system prompt block range is empty or below 1");
  }
  if (!(o.first_median_blocks > 0) || !(o.turn_median_blocks > 0) ||
      o.first_sigma < 0 || o.turn_sigma < 0) {
    return bad("content medians must be > 0 and sigmas >= 0");
  }
  if (o.max_blocks < 1) return bad("max_blocks < 1");
  if (o.block_tokens < 1) return bad("block_tokens < 1");
  if (o.mean_interarrival_ms < 0) return bad("mean_interarrival_ms < 0");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TraceRequest>> GenerateMatchedTrace(
    const MatchedTraceOptions& o) {
  if (absl::Status s = ValidateMatchedTraceOptions(o); !s.ok()) return s;
  std::mt19937_64 rng(o.seed);
  int64_t next_id = 0;
  // System prompts: fixed ids and lengths.
  std::vector<std::vector<int64_t>> prompts(o.system_prompts);
  for (auto& prompt : prompts) {
    const int64_t span = o.system_max_blocks - o.system_min_blocks + 1;
    const int64_t blocks =
        o.system_min_blocks + static_cast<int64_t>(rng() % span);
    for (int64_t b = 0; b < blocks; ++b) prompt.push_back(next_id++);
  }
  const Zipf slot_pick(o.slots, o.slot_zipf_s);
  const Zipf prompt_pick(o.system_prompts, o.system_zipf_s);
  const double end_p = 1.0 / (o.mean_turns - 1);
  std::vector<Session> slots(o.slots);
  std::vector<TraceRequest> trace;
  trace.reserve(o.requests);
  double now_ms = 0;
  for (int64_t r = 0; r < o.requests; ++r) {
    Session& session = slots[slot_pick(rng)];
    int64_t added = 0;
    if (session.turns_left == 0) {  // A fresh session.
      session.ids.clear();
      if (Uniform(rng) <= o.system_prompt_p) {
        session.ids = prompts[prompt_pick(rng)];
      }
      session.turns_left = 1;
      if (Uniform(rng) > o.one_shot_p) {
        // 1 + geometric (at least 1) of mean mean_turns - 1.
        session.turns_left = 2;
        while (Uniform(rng) > end_p) ++session.turns_left;
      }
      added = LogNormalBlocks(rng, o.first_median_blocks, o.first_sigma);
    } else {
      added = LogNormalBlocks(rng, o.turn_median_blocks, o.turn_sigma);
    }
    added = std::min<int64_t>(
        added, std::max<int64_t>(
                   1, o.max_blocks - static_cast<int64_t>(session.ids.size())));
    for (int64_t b = 0; b < added; ++b) session.ids.push_back(next_id++);
    --session.turns_left;
    TraceRequest request;
    request.timestamp_ms = static_cast<int64_t>(now_ms);
    request.hash_ids = session.ids;
    request.input_length =
        static_cast<int64_t>(session.ids.size()) * o.block_tokens;
    request.output_length = o.block_tokens / 2;
    trace.push_back(std::move(request));
    now_ms += -o.mean_interarrival_ms * std::log(Uniform(rng));
  }
  return trace;
}

}  // namespace hicache
