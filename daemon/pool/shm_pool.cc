#include "daemon/pool/shm_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace hicache {

namespace {

absl::Status ErrnoError(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOMEM || err == ENOSPC || err == EAGAIN) {
    return absl::ResourceExhaustedError(message);
  }
  if (err == EEXIST) return absl::AlreadyExistsError(message);
  if (err == EPERM || err == EACCES) {
    return absl::PermissionDeniedError(message);
  }
  return absl::InternalError(message);
}

absl::Status CheckSegmentName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos || name.size() > 200) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory name '", name,
        "' must be '/' followed by up to 199 characters without '/'"));
  }
  return absl::OkStatus();
}

std::string OctalMode(mode_t mode) {
  return absl::StrFormat("%04o", static_cast<unsigned>(mode & 07777));
}

}  // namespace

absl::Status ShareSegmentWithGroup(int fd, absl::string_view name) {
  // A setgid /dev/shm (or one a container runtime gave another group) would
  // hand the segment to the directory's group: give it to ours.
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return ErrnoError(errno, absl::StrCat("fstat ", name));
  }
  const gid_t group = getegid();
  if (st.st_gid != group && fchown(fd, static_cast<uid_t>(-1), group) != 0) {
    return ErrnoError(errno, absl::StrCat("fchown ", name, " to group ", group));
  }
  // shm_open applies the umask (0077 would leave 0600); set the mode exactly.
  if (fchmod(fd, kShmPoolMode) != 0) {
    return ErrnoError(errno, absl::StrCat("fchmod ", name));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmPool>> ShmPool::Create(
    const std::string& name, uint64_t size_bytes, bool lock_memory) {
  if (absl::Status valid = CheckSegmentName(name); !valid.ok()) return valid;
  if (size_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", name, " must have a positive size"));
  }
  const int fd =
      shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC,
               kShmPoolMode);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("shm_open ", name));
  // From here on, undo the segment on every error path.
  auto fail = [&](absl::Status status) {
    close(fd);
    shm_unlink(name.c_str());
    return status;
  };
  if (absl::Status shared = ShareSegmentWithGroup(fd, name); !shared.ok()) {
    return fail(std::move(shared));
  }
  if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) {
    return fail(ErrnoError(
        errno, absl::StrCat("ftruncate ", name, " to ", size_bytes, " bytes")));
  }
  return Map(fd, name, size_bytes, lock_memory, /*attached=*/false);
}

absl::StatusOr<std::unique_ptr<ShmPool>> ShmPool::Attach(
    const std::string& name, uint64_t size_bytes, bool lock_memory) {
  if (absl::Status valid = CheckSegmentName(name); !valid.ok()) return valid;
  if (size_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool ", name, " must have a positive size"));
  }
  const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("no shared-memory segment ", name, " to attach"));
    }
    // O_NOFOLLOW refuses a symbolic link (ELOOP); glibc reports a directory
    // as EINVAL (the name itself was checked above).
    if (err == ELOOP || err == EISDIR || err == EINVAL) {
      return absl::FailedPreconditionError(
          absl::StrCat("shared-memory segment ", name,
                       " is not a regular file: ", std::strerror(err)));
    }
    return ErrnoError(err, absl::StrCat("shm_open ", name));
  }
  // Checks on the open file itself, so a rename race cannot swap it.
  struct stat st {};
  absl::Status refused;
  if (fstat(fd, &st) != 0) {
    refused = ErrnoError(errno, absl::StrCat("fstat ", name));
  } else if (!S_ISREG(st.st_mode)) {
    refused = absl::FailedPreconditionError(
        absl::StrCat("shared-memory segment ", name, " is not a regular file"));
  } else if (st.st_uid != geteuid()) {
    refused = absl::FailedPreconditionError(
        absl::StrCat("shared-memory segment ", name, " is owned by uid ",
                     st.st_uid, ", not this daemon's ", geteuid()));
  } else if (st.st_gid != getegid() || (st.st_mode & 07777) != kShmPoolMode) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "shared-memory segment ", name, " has group ", st.st_gid, " and mode ",
        OctalMode(st.st_mode), ", not ", getegid(), " and ",
        OctalMode(kShmPoolMode),
        ": its access was changed, so others may have written it"));
  } else if (static_cast<uint64_t>(st.st_size) != size_bytes) {
    refused = absl::FailedPreconditionError(
        absl::StrCat("shared-memory segment ", name, " has ", st.st_size,
                     " bytes, not the expected ", size_bytes));
  }
  if (!refused.ok()) {
    close(fd);
    return refused;
  }
  return Map(fd, name, size_bytes, lock_memory, /*attached=*/true);
}

absl::StatusOr<std::unique_ptr<ShmPool>> ShmPool::Map(int fd,
                                                      const std::string& name,
                                                      uint64_t size_bytes,
                                                      bool lock_memory,
                                                      bool attached) {
  void* data =
      mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  close(fd);  // The mapping keeps the segment alive.
  if (data == MAP_FAILED) {
    if (!attached) shm_unlink(name.c_str());
    return ErrnoError(map_err, absl::StrCat("mmap ", name));
  }
  const absl::Time pin_start = absl::Now();
  if (lock_memory && mlock(data, size_bytes) != 0) {
    const int err = errno;
    munmap(data, size_bytes);
    if (!attached) shm_unlink(name.c_str());
    return ErrnoError(err, absl::StrCat("mlock ", size_bytes, " bytes of ",
                                        name, " (check RLIMIT_MEMLOCK)"));
  }
  const absl::Duration pin_time =
      lock_memory ? absl::Now() - pin_start : absl::ZeroDuration();
  return std::unique_ptr<ShmPool>(
      new ShmPool(name, size_bytes, data, lock_memory, pin_time, attached));
}

std::string ShmPool::PersistentName(absl::string_view prefix,
                                    absl::string_view kind, Rank rank,
                                    uint64_t fingerprint) {
  return absl::StrCat(prefix, "-", kind, "-r", rank, "-g",
                      absl::Hex(fingerprint, absl::kZeroPad16));
}

std::string ShmPool::PersistentHostName(absl::string_view prefix, Rank rank,
                                        uint64_t fingerprint) {
  return PersistentName(prefix, "host", rank, fingerprint);
}

ShmPool::ShmPool(std::string name, uint64_t size_bytes, void* data, bool locked,
                 absl::Duration pin_time, bool attached)
    : name_(std::move(name)),
      size_bytes_(size_bytes),
      data_(data),
      locked_(locked),
      pin_time_(pin_time),
      attached_(attached) {}

ShmPool::~ShmPool() {
  if (locked_) munlock(data_, size_bytes_);
  munmap(data_, size_bytes_);
  if (!kept()) shm_unlink(name_.c_str());
}

PoolExport ShmPool::Export() const {
  return PoolExport{PoolExport::Kind::kSharedMemory, name_, size_bytes_};
}

ShmPoolBackend::ShmPoolBackend(std::string prefix)
    : prefix_(prefix.empty() ? absl::StrCat("/hicache-", getpid())
                             : std::move(prefix)) {}

absl::StatusOr<std::unique_ptr<KvPool>> ShmPoolBackend::CreateDevicePool(
    Rank rank, uint64_t size_bytes) {
  auto pool = ShmPool::Create(absl::StrCat(prefix_, "-device-r", rank),
                              size_bytes, /*lock_memory=*/false);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<KvPool>(std::move(*pool));
}

absl::StatusOr<std::unique_ptr<KvPool>> ShmPoolBackend::CreateHostPool(
    Rank rank, uint64_t size_bytes, bool lock_memory) {
  auto pool = ShmPool::Create(absl::StrCat(prefix_, "-host-r", rank),
                              size_bytes, lock_memory);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<KvPool>(std::move(*pool));
}

}  // namespace hicache
