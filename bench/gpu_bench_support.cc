#include "bench/gpu_bench_support.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "daemon/pool/shm_capacity.h"

namespace hicache::bench {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status Annotate(const absl::Status& status, absl::string_view what) {
  return absl::Status(status.code(),
                      absl::StrCat(what, ": ", status.message()));
}

// --- JsonWriter --------------------------------------------------------------

std::string JsonQuote(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (empty_.empty()) return;  // The top-level value.
  if (!empty_.back()) out_ += ',';
  empty_.back() = false;
  out_ += '\n';
  out_.append(2 * empty_.size(), ' ');
}

void JsonWriter::Open(char bracket) {
  BeforeValue();
  out_ += bracket;
  empty_.push_back(true);
}

void JsonWriter::Close(char bracket) {
  const bool was_empty = empty_.back();
  empty_.pop_back();
  if (!was_empty) {
    out_ += '\n';
    out_.append(2 * empty_.size(), ' ');
  }
  out_ += bracket;
}

JsonWriter& JsonWriter::BeginObject() {
  Open('{');
  return *this;
}
JsonWriter& JsonWriter::EndObject() {
  Close('}');
  return *this;
}
JsonWriter& JsonWriter::BeginArray() {
  Open('[');
  return *this;
}
JsonWriter& JsonWriter::EndArray() {
  Close(']');
  return *this;
}

JsonWriter& JsonWriter::Key(absl::string_view key) {
  BeforeValue();
  out_ += JsonQuote(key);
  out_ += ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::String(absl::string_view value) {
  BeforeValue();
  out_ += JsonQuote(value);
  return *this;
}

JsonWriter& JsonWriter::Number(double value) {
  BeforeValue();
  if (std::isfinite(value)) {
    absl::StrAppendFormat(&out_, "%.6g", value);
  } else {
    out_ += "null";
  }
  return *this;
}

JsonWriter& JsonWriter::Int(int64_t value) {
  BeforeValue();
  absl::StrAppend(&out_, value);
  return *this;
}

JsonWriter& JsonWriter::Bool(bool value) {
  BeforeValue();
  out_ += value ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
  return *this;
}

// --- Summaries ---------------------------------------------------------------

Summary Summarize(std::vector<double> samples) {
  Summary s;
  s.count = samples.size();
  if (samples.empty()) {
    s.min = s.p10 = s.median = s.p90 = s.p99 = s.max = NAN;
    return s;
  }
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    const double rank = q * static_cast<double>(samples.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(rank));
    const size_t hi = std::min(lo + 1, samples.size() - 1);
    const double frac = rank - static_cast<double>(lo);
    return samples[lo] + (samples[hi] - samples[lo]) * frac;
  };
  s.min = samples.front();
  s.p10 = at(0.10);
  s.median = at(0.50);
  s.p90 = at(0.90);
  s.p99 = at(0.99);
  s.max = samples.back();
  return s;
}

void WriteSummary(JsonWriter& json, absl::string_view key,
                  const Summary& summary) {
  json.Key(key).BeginObject();
  json.Field("count", static_cast<int64_t>(summary.count));
  json.Field("min", summary.min);
  json.Field("p10", summary.p10);
  json.Field("median", summary.median);
  json.Field("p90", summary.p90);
  json.Field("p99", summary.p99);
  json.Field("max", summary.max);
  json.EndObject();
}

absl::StatusOr<uint64_t> MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "MemAvailable:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    uint64_t kib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) break;
    return kib * 1024;
  }
  return absl::UnavailableError("no MemAvailable line in /proc/meminfo");
}

// --- HostBuffer --------------------------------------------------------------

HostBuffer::HostBuffer(cuda::CudaRuntime* runtime, std::unique_ptr<ShmPool> shm,
                       void* anonymous, uint64_t bytes, std::string kind)
    : runtime_(runtime),
      shm_(std::move(shm)),
      anonymous_(anonymous),
      data_(shm_ != nullptr ? shm_->host_data() : anonymous),
      bytes_(bytes),
      kind_(std::move(kind)) {}

absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Create(
    cuda::CudaRuntime* runtime, const std::string& shm_name, uint64_t bytes) {
  // Segments are sparse: one that does not fit in /dev/shm would fault
  // (SIGBUS) when pinned, so only use /dev/shm with room to spare.
  constexpr uint64_t kShmSpare = 256ull << 20;
  absl::StatusOr<uint64_t> shm_free = ShmFreeBytes();
  if (shm_free.ok() && *shm_free >= bytes + kShmSpare) {
    absl::StatusOr<std::unique_ptr<ShmPool>> shm =
        ShmPool::Create(shm_name, bytes, /*lock_memory=*/false);
    if (!shm.ok()) return shm.status();
    return std::unique_ptr<HostBuffer>(new HostBuffer(
        runtime, *std::move(shm), nullptr, bytes, "shm " + shm_name));
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "mmap of ", bytes, " bytes of shared memory: ", std::strerror(errno)));
  }
  return std::unique_ptr<HostBuffer>(new HostBuffer(
      runtime, nullptr, data, bytes,
      absl::StrCat("anonymous shared mapping (/dev/shm has ",
                   shm_free.ok() ? absl::StrCat(*shm_free) : std::string("?"),
                   " bytes free)")));
}

HostBuffer::~HostBuffer() {
  if (registered_) (void)runtime_->HostUnregister(data_);
  if (anonymous_ != nullptr) munmap(anonymous_, bytes_);
  // shm_ unmaps and unlinks its segment.
}

absl::StatusOr<absl::Duration> HostBuffer::Register() {
  const absl::Time start = absl::Now();
  if (absl::Status s = runtime_->HostRegister(data_, bytes_); !s.ok()) {
    return s;
  }
  registered_ = true;
  return absl::Now() - start;
}

absl::StatusOr<absl::Duration> HostBuffer::Unregister() {
  const absl::Time start = absl::Now();
  if (absl::Status s = runtime_->HostUnregister(data_); !s.ok()) return s;
  registered_ = false;
  return absl::Now() - start;
}

// --- ProbingRuntime ----------------------------------------------------------

absl::Status ProbingRuntime::RecordEvent(cuda::Event event,
                                         cuda::Stream stream) {
  absl::Status status = base_->RecordEvent(event, stream);
  if (!status.ok()) return status;
  if (cuda::Event probe = armed_.exchange(nullptr); probe != nullptr) {
    probe_recorded_.store(base_->RecordEvent(probe, stream).ok());
  }
  return status;
}

}  // namespace hicache::bench
