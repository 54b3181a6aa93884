#include "client/ctl/output_format.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"

namespace hicache::ctl {
namespace {

std::string BackendText(v1::Backend backend) {
  switch (backend) {
    case v1::BACKEND_CPU:
      return "cpu";
    case v1::BACKEND_CUDA:
      return "cuda";
    default:
      return "unspecified";
  }
}

std::string HostLayoutText(v1::HostLayout layout) {
  switch (layout) {
    case v1::HOST_LAYOUT_LAYER_FIRST:
      return "layer_first";
    case v1::HOST_LAYOUT_PAGE_FIRST:
      return "page_first";
    default:
      return "unspecified";
  }
}

}  // namespace

std::string FormatUptime(absl::Duration uptime) {
  const int64_t seconds = std::max<int64_t>(0, absl::ToInt64Seconds(uptime));
  const int64_t values[] = {seconds / 86400, seconds / 3600 % 24,
                            seconds / 60 % 60, seconds % 60};
  const char* const units[] = {"d", "h", "m", "s"};
  int first = 0;
  while (first < 3 && values[first] == 0) ++first;
  if (first == 3) return absl::StrCat(values[3], "s");
  return absl::StrCat(values[first], units[first], " ", values[first + 1],
                      units[first + 1]);
}

std::string FormatStatsHuman(const v1::GetStatsResponse& stats) {
  const v1::BuildInfo& build = stats.build();
  const v1::PoolGeometry& geo = stats.geometry();
  std::string out;
  absl::StrAppendFormat(&out, "hicached %s (%s, %s, cuda %s, api %s)\n",
                        build.version(), build.compiler(), build.build_mode(),
                        build.cuda_support() ? "compiled in" : "not compiled",
                        build.proto_package());
  absl::StrAppendFormat(&out, "%-14s %d\n", "pid:", stats.pid());
  absl::StrAppendFormat(&out, "%-14s %s\n",
                        "listening:", stats.listen_address());
  absl::StrAppendFormat(&out, "%-14s %s\n", "uptime:",
                        FormatUptime(absl::Seconds(stats.uptime_seconds())));
  absl::StrAppendFormat(&out, "%-14s %s\n",
                        "backend:", BackendText(stats.backend()));
  absl::StrAppendFormat(&out, "%-14s %u tokens\n",
                        "page size:", geo.page_size_tokens());
  absl::StrAppendFormat(&out, "%-14s %u (ranks served: %s)\n",
                        "cp size:", geo.cp_size(),
                        absl::StrJoin(geo.served_ranks(), ","));
  absl::StrAppendFormat(&out, "%-14s %u per rank, %u logical\n",
                        "device pages:", geo.device_pages_per_rank(),
                        geo.logical_device_pages());
  absl::StrAppendFormat(&out, "%-14s %u per rank, %s\n",
                        "host pages:", geo.host_pages_per_rank(),
                        HostLayoutText(geo.host_layout()));
  return out;
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  options.always_print_enums_as_ints = false;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot render JSON: ", status.ToString()));
  }
  return json;
}

}  // namespace hicache::ctl
