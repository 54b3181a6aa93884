#include "daemon/persist/journal_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "daemon/persist/state_dir.h"

namespace hicache::persist {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // O_NONBLOCK: a FIFO planted as the journal must not block the start.
  const int fd =
      ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string message =
        absl::StrCat("open ", path, ": ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(message);
    return absl::InternalError(message);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file"));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("read ", path, ": ", std::strerror(err)));
    }
    if (n == 0) break;  // Shrunk while reading: keep what was there.
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(done);
  return data;
}

// Parents before children; drops (and counts) what is not reachable from a
// namespace root through live parents of the same namespace.
void OrderLive(absl::flat_hash_map<uint64_t, PutRecord> live,
               LoadedJournal* out) {
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> children;
  std::vector<uint64_t> level;
  for (const auto& [id, put] : live) {
    if (put.parent_persist_id == 0) {
      level.push_back(id);
    } else {
      children[put.parent_persist_id].push_back(id);
    }
  }
  out->puts.reserve(live.size());
  while (!level.empty()) {
    std::sort(level.begin(), level.end());
    std::vector<uint64_t> next;
    for (uint64_t id : level) {
      auto kids = children.find(id);
      PutRecord& put = live.find(id)->second;
      if (kids != children.end()) {
        for (uint64_t kid : kids->second) {
          if (live.find(kid)->second.name_space == put.name_space) {
            next.push_back(kid);
          }
        }
      }
      out->puts.push_back(std::move(put));
    }
    level = std::move(next);
  }
  out->orphans = static_cast<int64_t>(live.size() - out->puts.size());
}

}  // namespace

absl::StatusOr<LoadedJournal> LoadJournalBytes(
    absl::string_view bytes, const JournalGeometry* expected) {
  const absl::Time start = absl::Now();
  LoadedJournal out;
  out.file_bytes = bytes.size();
  if (absl::Status s = CheckFileHeader(bytes); !s.ok()) return s;
  size_t pos = kFileHeaderSize;

  absl::StatusOr<Frame> first = ParseFrame(bytes.substr(pos));
  if (!first.ok() || first->type != RecordType::kGeometry) {
    return absl::DataLossError(absl::StrCat(
        "journal: no valid Geometry record first",
        first.ok() ? "" : absl::StrCat(" (", first.status().message(), ")")));
  }
  absl::StatusOr<JournalGeometry> geometry =
      DecodeGeometryPayload(first->payload);
  if (!geometry.ok()) return geometry.status();
  if (expected != nullptr) {
    if (absl::Status s = CompareGeometry(*geometry, *expected); !s.ok()) {
      return s;
    }
  }
  out.geometry = *std::move(geometry);
  pos += first->size;
  out.records = 1;

  absl::flat_hash_map<uint64_t, PutRecord> live;
  while (pos < bytes.size()) {
    absl::StatusOr<Frame> frame = ParseFrame(bytes.substr(pos));
    absl::Status bad;
    if (!frame.ok()) {
      bad = frame.status();
    } else if (frame->type == RecordType::kPut) {
      absl::StatusOr<PutRecord> put = DecodePutPayload(frame->payload);
      if (!put.ok()) {
        bad = put.status();
      } else if (bad = ValidatePut(*put, out.geometry); bad.ok()) {
        const uint64_t id = put->persist_id;
        live.insert_or_assign(id, *std::move(put));
      }
    } else if (frame->type == RecordType::kDrop) {
      absl::StatusOr<uint64_t> id = DecodeDropPayload(frame->payload);
      if (!id.ok()) {
        bad = id.status();
      } else if (live.erase(*id) == 0) {
        ++out.unknown_drops;
      }
    } else if (frame->type == RecordType::kGeometry) {
      bad = absl::DataLossError("journal: a second Geometry record");
    } else if (frame->payload.size() != 0) {
      bad = absl::DataLossError("journal: Clean record with a payload");
    }
    if (!bad.ok()) {
      out.stop_reason = absl::StrCat("at byte ", pos, ": ", bad.message());
      break;
    }
    out.clean = frame->type == RecordType::kClean;
    ++out.records;
    pos += frame->size;
  }
  out.valid_bytes = pos;
  out.dropped_bytes = bytes.size() - pos;
  OrderLive(std::move(live), &out);
  out.parse_time = absl::Now() - start;
  return out;
}

absl::StatusOr<LoadedJournal> LoadJournal(const std::string& state_dir,
                                          const JournalGeometry* expected) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> bytes = ReadFile(JournalPath(state_dir));
  if (!bytes.ok()) return bytes.status();
  const absl::Duration read_time = absl::Now() - start;
  absl::StatusOr<LoadedJournal> loaded = LoadJournalBytes(*bytes, expected);
  if (loaded.ok()) loaded->read_time = read_time;
  return loaded;
}

}  // namespace hicache::persist
