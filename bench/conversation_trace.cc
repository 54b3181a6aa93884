#include "bench/conversation_trace.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {
namespace {

// --- Sampling from raw 64-bit draws ----------------------------------------
// Only IEEE-754 basic operations (+ - * /, exact scaling by powers of two)
// are used, so results are the same everywhere (the BUILD rule turns off
// FMA contraction).

constexpr double kLn2 = 0.693147180559945309417232121458;
constexpr double kTwoTo53 = 9007199254740992.0;

// Natural logarithm, x > 0: x = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// ln m = 2 atanh((m - 1) / (m + 1)) by its series (|z| < 0.172, 20 terms
// reach far below one ulp).
double DetLog(double x) {
  int e = 0;
  double m = std::frexp(x, &e);  // exact: m in [1/2, 1)
  if (m < 0.70710678118654752440) {
    m *= 2;
    --e;
  }
  const double z = (m - 1) / (m + 1);
  const double z2 = z * z;
  double term = z, sum = 0;
  for (int k = 1; k < 42; k += 2) {
    sum += term / k;
    term *= z2;
  }
  return 2 * sum + e * kLn2;
}

// e^y for moderate |y|: y = n ln2 + r, |r| <= ln2 / 2, Taylor series of e^r
// (30 terms), scaled by 2^n exactly.
double DetExp(double y) {
  const double n = std::floor(y / kLn2 + 0.5);
  const double r = y - n * kLn2;
  double term = 1, sum = 1;
  for (int k = 1; k < 30; ++k) {
    term = term * r / k;
    sum += term;
  }
  return std::ldexp(sum, static_cast<int>(n));
}

// Uniform in [lo, hi] (hi >= lo, range far below 2^64: the bias of the
// multiply-shift map is below range / 2^64).
int64_t UniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  const unsigned __int128 range = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(
                  (static_cast<unsigned __int128>(rng()) * range) >> 64);
}

// Uniform in (0, 1], a multiple of 2^-53.
double UniformOpenClosed(std::mt19937_64& rng) {
  return static_cast<double>((rng() >> 11) + 1) / kTwoTo53;
}

// Zipf over ranks 0 .. n-1, P(k) ~ (k + 1)^-s, by inverse CDF on 53-bit
// integer thresholds.
class ZipfSampler {
 public:
  ZipfSampler(int64_t n, double s) {
    std::vector<double> cumulative(n);
    double total = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double rank = static_cast<double>(k + 1);
      total += s == 1.0   ? 1.0 / rank
               : s == 0.0 ? 1.0
                          : DetExp(-s * DetLog(rank));
      cumulative[k] = total;
    }
    thresholds_.resize(n);
    for (int64_t k = 0; k < n; ++k) {
      thresholds_[k] =
          static_cast<uint64_t>(std::floor(cumulative[k] / total * kTwoTo53));
    }
    thresholds_[n - 1] = static_cast<uint64_t>(kTwoTo53);
  }

  int64_t Sample(std::mt19937_64& rng) const {
    const uint64_t u = rng() >> 11;  // uniform in [0, 2^53)
    return std::upper_bound(thresholds_.begin(), thresholds_.end(), u) -
           thresholds_.begin();
  }

 private:
  std::vector<uint64_t> thresholds_;
};

// --- The workload ----------------------------------------------------------

struct Conversation {
  bool active = false;
  int64_t id = 0;
  int64_t turns = 0;  // turns taken so far
  int64_t system_prompt = 0;
  int64_t last_input = 0;
  int64_t last_output = 0;
  std::vector<int64_t> full_ids;  // ids of the last input's full blocks
};

absl::Status Require(bool ok, absl::string_view what) {
  return ok ? absl::OkStatus()
            : absl::InvalidArgumentError(
                  absl::StrCat("conversation trace: ", what));
}

}  // namespace

absl::Status ValidateConversationTraceOptions(
    const ConversationTraceOptions& o) {
  for (const absl::Status& s : {
           Require(o.requests >= 0, "requests must be >= 0"),
           Require(o.conversations >= 1, "conversations must be >= 1"),
           Require(o.zipf_s >= 0 && o.zipf_s <= 10,
                   "zipf_s must be in [0, 10]"),
           Require(o.system_prompts >= 1, "system_prompts must be >= 1"),
           Require(o.system_prompt_tokens >= 0,
                   "system_prompt_tokens must be >= 0"),
           Require(
               o.min_user_tokens >= 1 && o.min_user_tokens <= o.max_user_tokens,
               "need 1 <= min_user_tokens <= max_user_tokens"),
           Require(o.min_output_tokens >= 0 &&
                       o.min_output_tokens <= o.max_output_tokens,
                   "need 0 <= min_output_tokens <= max_output_tokens"),
           Require(o.max_user_tokens <= (int64_t{1} << 30) &&
                       o.max_output_tokens <= (int64_t{1} << 30) &&
                       o.system_prompt_tokens <= (int64_t{1} << 30),
                   "token counts must be <= 2^30"),
           Require(o.max_turns >= 1, "max_turns must be >= 1"),
           Require(o.block_tokens >= 1, "block_tokens must be >= 1"),
           Require(o.mean_interarrival_ms >= 0 && o.mean_interarrival_ms <= 1e9,
                   "mean_interarrival_ms must be in [0, 1e9]"),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ConversationRequest>> GenerateConversationTrace(
    const ConversationTraceOptions& o) {
  if (absl::Status s = ValidateConversationTraceOptions(o); !s.ok()) return s;
  std::mt19937_64 rng(o.seed);
  const ZipfSampler zipf(o.conversations, o.zipf_s);
  const int64_t block = o.block_tokens;
  const int64_t prompt_blocks = o.system_prompt_tokens / block;
  int64_t next_id = o.system_prompts * prompt_blocks;
  int64_t next_conversation = 0;
  std::vector<Conversation> slots(o.conversations);
  std::vector<ConversationRequest> out;
  out.reserve(o.requests);
  double now_ms = 0;
  for (int64_t i = 0; i < o.requests; ++i) {
    // The draws, always in this order: gap, slot, [system prompt], user
    // message, output.
    const double gap = -o.mean_interarrival_ms * DetLog(UniformOpenClosed(rng));
    if (i > 0) now_ms += gap;
    const int64_t slot = zipf.Sample(rng);
    Conversation& c = slots[slot];
    int64_t prefix_tokens = 0;
    std::vector<int64_t> ids;
    if (!c.active || c.turns >= o.max_turns) {
      c = Conversation{};
      c.active = true;
      c.id = next_conversation++;
      c.system_prompt = UniformInt(rng, 0, o.system_prompts - 1);
      prefix_tokens = o.system_prompt_tokens;
      for (int64_t b = 0; b < prompt_blocks; ++b) {
        ids.push_back(c.system_prompt * prompt_blocks + b);
      }
    } else {
      prefix_tokens = c.last_input + c.last_output;
      ids = std::move(c.full_ids);
    }
    const int64_t user = UniformInt(rng, o.min_user_tokens, o.max_user_tokens);
    const int64_t output =
        UniformInt(rng, o.min_output_tokens, o.max_output_tokens);
    const int64_t input = prefix_tokens + user;
    const int64_t blocks = (input + block - 1) / block;
    while (static_cast<int64_t>(ids.size()) < blocks) ids.push_back(next_id++);

    ConversationRequest r;
    r.request.timestamp_ms = static_cast<int64_t>(std::floor(now_ms));
    r.request.input_length = input;
    r.request.output_length = output;
    r.request.hash_ids = ids;
    r.slot = slot;
    r.conversation = c.id;
    r.turn = c.turns;
    r.system_prompt = c.system_prompt;
    out.push_back(std::move(r));

    ids.resize(input / block);
    c.full_ids = std::move(ids);
    c.last_input = input;
    c.last_output = output;
    ++c.turns;
  }
  return out;
}

std::string MooncakeLine(const TraceRequest& r) {
  std::string line = absl::StrCat("{\"timestamp\": ", r.timestamp_ms,
                                  ", \"input_length\": ", r.input_length,
                                  ", \"output_length\": ", r.output_length,
                                  ", \"hash_ids\": [");
  for (size_t i = 0; i < r.hash_ids.size(); ++i) {
    absl::StrAppend(&line, i == 0 ? "" : ", ", r.hash_ids[i]);
  }
  line += "]}";
  return line;
}

void WriteMooncakeTrace(const std::vector<ConversationRequest>& trace,
                        std::ostream& out) {
  for (const ConversationRequest& r : trace) {
    out << MooncakeLine(r.request) << '\n';
  }
}

}  // namespace hicache
