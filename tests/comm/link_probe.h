#pragma once

// LinkProbe: the receiving side of a Communicator under test. Records the
// frames delivered and the failure, checks the contract's threading clauses
// (one delivery thread, nothing delivered after on_failure, on_failure once)
// and lets tests wait for either without sleeping. std::promise / condition
// variables only (Debian's Abseil is not TSan-instrumented).

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/comm/communicator.h"

namespace hicache::comm::testing {

class LinkProbe {
 public:
  LinkProbe() : failed_future_(failed_.get_future().share()) {}

  Communicator::Receiver receiver() {
    return [this](absl::string_view frame) { OnFrame(frame); };
  }
  Communicator::FailureHandler on_failure() {
    return [this](const absl::Status& cause) { OnFailure(cause); };
  }
  absl::Status StartOn(Communicator& link) {
    return link.Start(receiver(), on_failure());
  }

  // Waits until `n` frames arrived (or the link failed); true on success.
  bool WaitFrames(size_t n, std::chrono::milliseconds timeout =
                                std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return frames_.size() >= n; });
  }
  // Waits for on_failure; nullopt after `timeout`.
  std::optional<absl::Status> WaitFailure(
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    if (failed_future_.wait_for(timeout) != std::future_status::ready) {
      return std::nullopt;
    }
    return failed_future_.get();
  }

  std::vector<std::string> frames() const {
    std::lock_guard<std::mutex> lock(mu_);
    return frames_;
  }
  size_t frame_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return frames_.size();
  }
  int failures() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }
  // Contract violations seen so far (empty when none).
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }
  // The thread that ran the callbacks (default id before any callback).
  std::thread::id callback_thread() const {
    std::lock_guard<std::mutex> lock(mu_);
    return thread_;
  }

 private:
  void NoteThreadLocked(const char* what) {
    const std::thread::id me = std::this_thread::get_id();
    if (thread_ == std::thread::id()) thread_ = me;
    if (thread_ != me) {
      violations_.push_back(std::string(what) + " on a second thread");
    }
  }

  void OnFrame(absl::string_view frame) {
    std::lock_guard<std::mutex> lock(mu_);
    NoteThreadLocked("frame");
    if (failures_ > 0) violations_.push_back("frame after on_failure");
    frames_.emplace_back(frame);
    cv_.notify_all();
  }

  void OnFailure(const absl::Status& cause) {
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      NoteThreadLocked("on_failure");
      if (cause.ok()) violations_.push_back("on_failure with OK");
      first = ++failures_ == 1;
      if (!first) violations_.push_back("on_failure called twice");
      cv_.notify_all();
    }
    if (first) failed_.set_value(cause);
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> frames_;
  std::vector<std::string> violations_;
  int failures_ = 0;
  std::thread::id thread_;
  std::promise<absl::Status> failed_;
  std::shared_future<absl::Status> failed_future_;
};

// "<prefix><i>" padded with `pad` copies of a byte derived from i.
inline std::string NumberedFrame(const std::string& prefix, int i,
                                 size_t pad = 0) {
  std::string s = prefix + std::to_string(i) + ":";
  s.append(pad, static_cast<char>('a' + i % 26));
  return s;
}

}  // namespace hicache::comm::testing
