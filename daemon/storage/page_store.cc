#include "daemon/storage/page_store.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/mutex.h"

namespace hicache {
namespace {

// One result handed from a store's thread to the waiting caller.
template <typename T>
class Waiter {
 public:
  void Set(T value) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    value_ = std::move(value);
    cv_.SignalAll();
  }
  T Wait() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    while (!value_.has_value()) cv_.Wait(&mu_);
    return std::move(*value_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::optional<T> value_ ABSL_GUARDED_BY(mu_);
};

template <typename Item, typename Call>
std::vector<absl::Status> RunAndWait(std::vector<Item> items, Call call) {
  Waiter<std::vector<absl::Status>> waiter;
  call(std::move(items),
       [&waiter](std::vector<absl::Status> r) { waiter.Set(std::move(r)); });
  return waiter.Wait();
}

}  // namespace

absl::Status CheckPageBytes(size_t bytes, int64_t page_bytes) {
  if (static_cast<int64_t>(bytes) == page_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "a page of ", bytes, " bytes; the store's are ", page_bytes));
}

std::vector<absl::Status> PutAndWait(PageStore& store,
                                     std::vector<StorePut> puts) {
  return RunAndWait(std::move(puts), [&store](auto items, StoreDone done) {
    store.Put(std::move(items), std::move(done));
  });
}

std::vector<absl::Status> GetAndWait(PageStore& store,
                                     std::vector<StoreGet> gets) {
  return RunAndWait(std::move(gets), [&store](auto items, StoreDone done) {
    store.Get(std::move(items), std::move(done));
  });
}

std::vector<absl::Status> RemoveAndWait(PageStore& store,
                                        std::vector<StoreKey> keys) {
  return RunAndWait(std::move(keys), [&store](auto items, StoreDone done) {
    store.Remove(std::move(items), std::move(done));
  });
}

std::vector<bool> ExistsAndWait(PageStore& store, std::vector<StoreKey> keys) {
  Waiter<std::vector<bool>> waiter;
  store.Exists(std::move(keys),
               [&waiter](std::vector<bool> r) { waiter.Set(std::move(r)); });
  return waiter.Wait();
}

}  // namespace hicache
