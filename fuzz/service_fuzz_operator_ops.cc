// Operator ops of //fuzz:service_fuzzer (Run, service_fuzz_run.h): Evict,
// SetFreeRoom, namespace quotas, Stats, DumpTree, InspectNode, ListSessions
// and GetLayout -- also as a client, which operator RPCs refuse.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

void Run::EvictOp() {
  v1::EvictRequest request;
  const uint8_t b = in_.Byte();
  const Caller& as =
      (b & 0xC0) == 0xC0 ? Service::Client() : Service::Operator();
  const size_t lanes = (b & 7) % (cp_ + 2);
  const size_t ranks = ((b >> 3) & 7) % (cp_ + 2);
  for (size_t i = 0; i < lanes; ++i) {
    request.add_device_pages_per_lane(in_.Count());
  }
  for (size_t i = 0; i < ranks; ++i) {
    request.add_host_pages_per_rank(in_.Count());
  }
  Check("Evict", service_->Evict(as, request));
}

void Run::SetFreeRoomOp() {
  v1::SetFreeRoomRequest request;
  int64_t l1 = in_.Count();
  int64_t l2 = in_.Count();
  request.set_l1_pages_per_lane(l1);
  request.set_l2_pages_per_rank(l2);
  Check("SetFreeRoom", service_->SetFreeRoom(Service::Operator(), request));
}

// A namespace quota: set (a client is refused), then read back. A refused
// quota changes nothing; an accepted one is what the listing says. Small
// counts (`b` bit 4) make limits and guarantees bite within the fuzzer's
// pools.
void Run::QuotaOp() {
  const uint8_t b = in_.Byte();
  static constexpr const char* kNamespaces[] = {"", "a", "b", "c"};
  const bool client = (b & 0xC0) == 0xC0;
  v1::SetQuotaRequest request;
  v1::NamespaceQuota* q = request.mutable_quota();
  q->set_namespace_(kNamespaces[b & 3]);
  auto count = [&]() -> int64_t {
    return (b & 0x10) != 0 ? in_.Byte() % 24 : in_.Count();
  };
  if ((b & 0x04) != 0) q->set_device_limit_pages(count());
  if ((b & 0x08) != 0) q->set_device_guaranteed_pages(count());
  if ((b & 0x20) != 0) q->set_host_limit_pages(count());
  if ((b & 0x40) != 0 && !client) q->set_host_guaranteed_pages(count());
  v1::ListQuotasResponse before;
  Check("ListQuotas", service_->ListQuotas(Service::Operator(), &before));
  const grpc::Status set = service_->SetQuota(
      client ? Service::Client() : Service::Operator(), request);
  Check("SetQuota", set);
  if (client && set.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
    Fail(absl::StrCat("a client's SetQuota answered ", set.error_code()),
         engine_.get());
  }
  v1::ListQuotasResponse after;
  Check("ListQuotas", service_->ListQuotas(Service::Operator(), &after));
  auto quota_of = [](const v1::ListQuotasResponse& list,
                     const std::string& ns) {
    for (const v1::NamespaceQuotaUsage& u : list.namespaces()) {
      if (u.quota().namespace_() == ns) return u.quota().SerializeAsString();
    }
    v1::NamespaceQuota none;
    none.set_namespace_(ns);
    return none.SerializeAsString();
  };
  const std::string& ns = q->namespace_();
  const std::string expected =
      set.ok() ? request.quota().SerializeAsString() : quota_of(before, ns);
  if (quota_of(after, ns) != expected) {
    Fail(absl::StrCat("SetQuota of '", ns, "' answered ", set.error_code(),
                      " but ListQuotas lists another quota"),
         engine_.get());
  }
}

// An operator, or (bit 7 of `b`) a client, which operator RPCs refuse.
const Caller& Run::As(uint8_t b) {
  return (b & 0x80) != 0 ? Service::Client() : Service::Operator();
}

void Run::InspectOp() {
  const uint8_t b = in_.Byte();
  switch ((b & 7) % 5) {
    case 0:
      Check("Stats", service_->Stats());
      break;
    case 1: {
      v1::DumpTreeRequest request;
      request.set_all_namespaces((b & 8) != 0);
      request.set_namespace_((b & 16) != 0 ? "a" : "");
      request.set_prefix(ReadTokens(in_).Packed());
      request.set_max_depth(static_cast<int32_t>(in_.Count()));
      request.set_limit(in_.Count());
      Check("DumpTree", service_->DumpTree(As(b), request));
      break;
    }
    case 2: {
      v1::InspectNodeRequest request;
      request.set_node(PickNode());
      Check("InspectNode", service_->InspectNode(As(b), request));
      break;
    }
    case 3: {
      v1::ListSessionsResponse response;
      Check("ListSessions", service_->ListSessions(As(b), &response));
      break;
    }
    default:
      Check("GetLayout", service_->GetLayout());
      break;
  }
}

}  // namespace hicache::fuzz
