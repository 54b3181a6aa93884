#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/backend/backend.h"
#include "daemon/core/daemon_config.h"

namespace hicache {

// OK when `config.backend` can run on this machine. For --backend=cuda with
// the real runtime: FAILED_PRECONDITION saying why not -- this hicached was
// built without CUDA, there is no driver or no visible GPU, or --gpus names a
// device that is not there. The CPU backend and the simulated CUDA runtime
// are always available.
absl::Status CheckBackendAvailable(const DaemonConfig& config);

// The backend the daemon's engine uses. Host pools (and the CPU backend's
// device pools) are shared-memory segments named "<shm_prefix>-...".
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(
    const DaemonConfig& config, const std::string& shm_prefix);

}  // namespace hicache
