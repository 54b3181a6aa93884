#include "client/ctl/quota_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ctl/cli.h"
#include "client/ctl/command_support.h"
#include "grpcpp/client_context.h"

namespace hicache::ctl {
namespace {

// "12 / 400 (guaranteed 100)", with "-" for what is not set.
std::string Against(int64_t used, int64_t limit, int64_t guaranteed) {
  return absl::StrCat(used, " / ", limit > 0 ? absl::StrCat(limit) : "-",
                      guaranteed > 0 ? absl::StrCat(" (", guaranteed, ")")
                                     : "");
}

}  // namespace

int RunQuota(const QuotaOptions& o, const CommandContext& c) {
  const bool sets = o.device_limit || o.device_guaranteed || o.host_limit ||
                    o.host_guaranteed;
  if ((sets || o.clear) && !o.ns.has_value()) {
    return Usage(c, "quota: --ns NS names the namespace to set ('' is the "
                    "default namespace)");
  }
  if (sets && o.clear) {
    return Usage(c, "quota: --clear takes no page options");
  }
  auto stub = Stub(c);
  v1::ListQuotasResponse list;
  {
    grpc::ClientContext ctx;
    Deadline(&ctx, c.timeout);
    const grpc::Status status =
        stub->ListQuotas(&ctx, v1::ListQuotasRequest(), &list);
    if (!status.ok()) return RpcError(status, ctx, c);
  }
  if (o.ns.has_value() && (sets || o.clear)) {
    v1::SetQuotaRequest request;
    v1::NamespaceQuota* quota = request.mutable_quota();
    for (const v1::NamespaceQuotaUsage& u : list.namespaces()) {
      if (u.quota().namespace_() == *o.ns) *quota = u.quota();
    }
    quota->set_namespace_(*o.ns);
    if (o.clear) {
      quota->set_device_limit_pages(0);
      quota->set_device_guaranteed_pages(0);
      quota->set_host_limit_pages(0);
      quota->set_host_guaranteed_pages(0);
    }
    if (o.device_limit) quota->set_device_limit_pages(*o.device_limit);
    if (o.device_guaranteed) {
      quota->set_device_guaranteed_pages(*o.device_guaranteed);
    }
    if (o.host_limit) quota->set_host_limit_pages(*o.host_limit);
    if (o.host_guaranteed) quota->set_host_guaranteed_pages(*o.host_guaranteed);
    grpc::ClientContext ctx;
    Deadline(&ctx, c.timeout);
    v1::SetQuotaResponse response;
    const grpc::Status status = stub->SetQuota(&ctx, request, &response);
    if (!status.ok()) return RpcError(status, ctx, c);
    if (c.json) {
      PrintJson(ProtoToJson(response), c);
      return kExitOk;
    }
    const v1::NamespaceQuota& q = response.quota();
    *c.out << absl::StrFormat(
        "quota of namespace '%s': device limit %d, guaranteed %d; host limit "
        "%d, guaranteed %d (pages; 0 = none)\n",
        q.namespace_(), q.device_limit_pages(), q.device_guaranteed_pages(),
        q.host_limit_pages(), q.host_guaranteed_pages());
    return kExitOk;
  }
  if (c.json) {
    PrintJson(ProtoToJson(list), c);
    return kExitOk;
  }
  if (list.namespaces().empty()) {
    *c.out << "(no namespaces)\n";
    return kExitOk;
  }
  *c.out << absl::StrFormat("%-24s %-32s %s\n", "NAMESPACE",
                            "DEVICE used / limit (guaranteed)",
                            "HOST used / limit (guaranteed)");
  for (const v1::NamespaceQuotaUsage& u : list.namespaces()) {
    const v1::NamespaceQuota& q = u.quota();
    *c.out << absl::StrFormat(
        "%-24s %-32s %s\n", absl::StrCat("'", q.namespace_(), "'"),
        Against(u.device_cached_pages() + u.device_request_pages(),
                q.device_limit_pages(), q.device_guaranteed_pages()),
        Against(u.host_pages(), q.host_limit_pages(),
                q.host_guaranteed_pages()));
  }
  return kExitOk;
}

}  // namespace hicache::ctl
