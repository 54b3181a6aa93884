#include "bench/mooncake_trace.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace hicache {
namespace {

// The text after "key": up to the next ',' or '}' (or the whole [...] list).
bool FieldText(absl::string_view line, absl::string_view key,
               absl::string_view* out) {
  const std::string quoted = absl::StrCat("\"", key, "\"");
  size_t at = line.find(quoted);
  if (at == absl::string_view::npos) return false;
  at = line.find(':', at + quoted.size());
  if (at == absl::string_view::npos) return false;
  absl::string_view rest =
      absl::StripLeadingAsciiWhitespace(line.substr(at + 1));
  size_t end =
      rest.front() == '[' ? rest.find(']') + 1 : rest.find_first_of(",}");
  if (end == absl::string_view::npos || end == 0) return false;
  *out = absl::StripAsciiWhitespace(rest.substr(0, end));
  return true;
}

bool IntField(absl::string_view line, absl::string_view key, int64_t* value) {
  absl::string_view text;
  return FieldText(line, key, &text) && absl::SimpleAtoi(text, value);
}

}  // namespace

std::string TracePathOrDefault(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return absl::StrCat(workspace != nullptr ? workspace : ".",
                      "/bench/traces/mooncake_synthetic.jsonl");
}

absl::StatusOr<std::vector<TraceRequest>> ReadMooncakeTrace(
    const std::string& path, int64_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace ", path));
  std::vector<TraceRequest> requests;
  std::string line;
  int64_t number = 0;
  while ((limit < 0 || static_cast<int64_t>(requests.size()) < limit) &&
         std::getline(in, line)) {
    ++number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    TraceRequest r;
    absl::string_view ids;
    if (!IntField(line, "timestamp", &r.timestamp_ms) ||
        !IntField(line, "input_length", &r.input_length) ||
        !IntField(line, "output_length", &r.output_length) ||
        !FieldText(line, "hash_ids", &ids) || ids.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", number, ": not a Mooncake trace record"));
    }
    ids = ids.substr(1, ids.size() - 2);
    for (absl::string_view id :
         absl::StrSplit(ids, ',', absl::SkipWhitespace())) {
      int64_t value = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(id), &value) ||
          value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", number, ": bad hash id '", id, "'"));
      }
      r.hash_ids.push_back(value);
    }
    requests.push_back(std::move(r));
  }
  return requests;
}

void TraceTokensInto(const TraceRequest& request, int64_t block_tokens,
                     std::vector<int32_t>* out) {
  out->resize(request.hash_ids.size() * block_tokens);
  int32_t* next = out->data();
  for (int64_t h : request.hash_ids) {
    for (int64_t i = 0; i < block_tokens; ++i) {
      *next++ = static_cast<int32_t>(h * block_tokens + i);
    }
  }
}

std::vector<int32_t> TraceTokens(const TraceRequest& request,
                                 int64_t block_tokens) {
  std::vector<int32_t> tokens;
  TraceTokensInto(request, block_tokens, &tokens);
  return tokens;
}

}  // namespace hicache
