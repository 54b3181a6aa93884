#include "daemon/pool/shm_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
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
  if (name.size() < 2 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos || name.size() > 200) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory name '", name,
        "' must be '/' followed by up to 199 characters without '/'"));
  }
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
  void* data =
      mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return fail(ErrnoError(errno, absl::StrCat("mmap ", name)));
  }
  close(fd);  // The mapping keeps the segment alive.
  const absl::Time pin_start = absl::Now();
  if (lock_memory && mlock(data, size_bytes) != 0) {
    const int err = errno;
    munmap(data, size_bytes);
    shm_unlink(name.c_str());
    return ErrnoError(err, absl::StrCat("mlock ", size_bytes, " bytes of ",
                                        name, " (check RLIMIT_MEMLOCK)"));
  }
  const absl::Duration pin_time =
      lock_memory ? absl::Now() - pin_start : absl::ZeroDuration();
  return std::unique_ptr<ShmPool>(
      new ShmPool(name, size_bytes, data, lock_memory, pin_time));
}

ShmPool::ShmPool(std::string name, uint64_t size_bytes, void* data, bool locked,
                 absl::Duration pin_time)
    : name_(std::move(name)),
      size_bytes_(size_bytes),
      data_(data),
      locked_(locked),
      pin_time_(pin_time) {}

ShmPool::~ShmPool() {
  if (locked_) munlock(data_, size_bytes_);
  munmap(data_, size_bytes_);
  shm_unlink(name_.c_str());
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
