#include "daemon/service/proto_convert.h"

#include <string>

namespace hicache::service {

v1::Backend ToProto(BackendKind backend) {
  switch (backend) {
    case BackendKind::kCpu:
      return v1::BACKEND_CPU;
    case BackendKind::kCuda:
      return v1::BACKEND_CUDA;
  }
  return v1::BACKEND_UNSPECIFIED;
}

v1::HostLayout ToProto(HostLayout layout) {
  switch (layout) {
    case HostLayout::kLayerFirst:
      return v1::HOST_LAYOUT_LAYER_FIRST;
    case HostLayout::kPageFirst:
      return v1::HOST_LAYOUT_PAGE_FIRST;
  }
  return v1::HOST_LAYOUT_UNSPECIFIED;
}

void ToProto(const BuildInfo& build, v1::BuildInfo* out) {
  out->set_version(build.version);
  out->set_git_revision(build.git_revision);
  out->set_compiler(build.compiler);
  out->set_build_mode(build.build_mode);
  out->set_cuda_support(build.cuda_support);
  out->set_proto_package(v1::GetStatsResponse::descriptor()->file()->package());
}

void ToProto(const DaemonConfig& config, v1::PoolGeometry* out) {
  out->set_page_size_tokens(config.page_size);
  out->set_cp_size(config.cp_size);
  for (uint32_t rank : config.EffectiveRanks()) out->add_served_ranks(rank);
  out->set_device_pages_per_rank(config.device_pages_per_rank);
  out->set_host_pages_per_rank(config.host_pages_per_rank);
  out->set_logical_device_pages(config.LogicalDevicePages());
  out->set_host_layout(ToProto(config.host_layout));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numeric values.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace hicache::service
