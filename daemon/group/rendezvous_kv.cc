#include "daemon/group/rendezvous_kv.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace hicache::group {

InMemoryRendezvousKv::InMemoryRendezvousKv(RendezvousKvLimits limits)
    : limits_(limits) {}

InMemoryRendezvousKv::~InMemoryRendezvousKv() {
  Shutdown();
  MutexLock lock(&mu_);
  while (waiters_ > 0) changed_.Wait(&mu_);
}

absl::Status InMemoryRendezvousKv::CheckKey(absl::string_view key) const {
  if (key.empty()) {
    return absl::InvalidArgumentError("rendezvous key is empty");
  }
  if (key.size() > limits_.max_key_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous key of ", key.size(), " bytes exceeds ",
                     limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status InMemoryRendezvousKv::Set(absl::string_view key,
                                       absl::string_view value) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (value.size() > limits_.max_value_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous value of ", value.size(), " bytes exceeds ",
                     limits_.max_value_bytes));
  }
  MutexLock lock(&mu_);
  if (shut_down_) return absl::CancelledError("rendezvous store shut down");
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    if (it->second == value) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("rendezvous key \"", absl::CHexEscape(key),
                     "\" is already set to another value"));
  }
  if (entries_.size() >= limits_.max_keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous store holds its maximum of ", limits_.max_keys, " keys"));
  }
  const size_t bytes = key.size() + value.size();
  if (bytes > limits_.max_total_bytes - total_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous store would exceed ", limits_.max_total_bytes, " bytes"));
  }
  entries_.emplace(std::string(key), std::string(value));
  total_bytes_ += bytes;
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryRendezvousKv::Get(absl::string_view key,
                                                      absl::Duration wait) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (wait < absl::ZeroDuration()) wait = absl::ZeroDuration();
  if (wait > limits_.max_wait) wait = limits_.max_wait;
  const absl::Time deadline = absl::Now() + wait;
  MutexLock lock(&mu_);
  auto absent = [&] {
    return absl::NotFoundError(
        absl::StrCat("rendezvous key \"", absl::CHexEscape(key),
                     "\" not set (waited ", absl::FormatDuration(wait), ")"));
  };
  if (shut_down_) return absl::CancelledError("rendezvous store shut down");
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  if (wait == absl::ZeroDuration()) return absent();
  if (waiters_ >= limits_.max_waiters) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous store already has ", limits_.max_waiters,
                     " waiting readers"));
  }
  ++waiters_;
  absl::StatusOr<std::string> result = absent();
  while (true) {
    if (shut_down_) {
      result = absl::CancelledError("rendezvous store shut down");
      break;
    }
    if (auto it = entries_.find(key); it != entries_.end()) {
      result = it->second;
      break;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    changed_.WaitWithTimeout(&mu_, left);
  }
  --waiters_;
  changed_.SignalAll();  // The destructor may wait for the last waiter.
  return result;
}

size_t InMemoryRendezvousKv::EraseUnderPrefix(absl::string_view prefix) {
  if (prefix.empty()) return 0;
  MutexLock lock(&mu_);
  size_t erased = 0;
  auto it = entries_.lower_bound(prefix);
  while (it != entries_.end() &&
         absl::string_view(it->first).substr(0, prefix.size()) == prefix) {
    total_bytes_ -= it->first.size() + it->second.size();
    it = entries_.erase(it);
    ++erased;
  }
  return erased;
}

void InMemoryRendezvousKv::Shutdown() {
  MutexLock lock(&mu_);
  shut_down_ = true;
  changed_.SignalAll();
}

size_t InMemoryRendezvousKv::num_keys() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

size_t InMemoryRendezvousKv::total_bytes() const {
  MutexLock lock(&mu_);
  return total_bytes_;
}

size_t InMemoryRendezvousKv::num_waiters() const {
  MutexLock lock(&mu_);
  return waiters_;
}

}  // namespace hicache::group
