#include "daemon/service/proto_convert.h"

#include "gtest/gtest.h"

namespace hicache::service {
namespace {

TEST(ProtoConvertTest, BackendKind) {
  EXPECT_EQ(ToProto(BackendKind::kCpu), v1::BACKEND_CPU);
  EXPECT_EQ(ToProto(BackendKind::kCuda), v1::BACKEND_CUDA);
}

TEST(ProtoConvertTest, HostLayout) {
  EXPECT_EQ(ToProto(HostLayout::kLayerFirst), v1::HOST_LAYOUT_LAYER_FIRST);
  EXPECT_EQ(ToProto(HostLayout::kPageFirst), v1::HOST_LAYOUT_PAGE_FIRST);
}

TEST(ProtoConvertTest, BuildInfo) {
  BuildInfo build{.version = "1.2.3",
                  .git_revision = "0123456789ab-dirty",
                  .compiler = "gcc 12.2.0",
                  .build_mode = "opt+asan",
                  .cuda_support = true};
  v1::BuildInfo out;
  ToProto(build, &out);
  EXPECT_EQ(out.version(), "1.2.3");
  EXPECT_EQ(out.git_revision(), "0123456789ab-dirty");
  EXPECT_EQ(out.compiler(), "gcc 12.2.0");
  EXPECT_EQ(out.build_mode(), "opt+asan");
  EXPECT_TRUE(out.cuda_support());
  EXPECT_EQ(out.proto_package(), "hicache.v1");
}

TEST(ProtoConvertTest, GeometryExpandsDefaultRanks) {
  DaemonConfig config;
  config.page_size = 32;
  config.cp_size = 4;
  config.device_pages_per_rank = 100;
  config.host_pages_per_rank = 300;
  config.host_layout = HostLayout::kPageFirst;
  v1::PoolGeometry out;
  ToProto(config, &out);
  EXPECT_EQ(out.page_size_tokens(), 32u);
  EXPECT_EQ(out.cp_size(), 4u);
  ASSERT_EQ(out.served_ranks_size(), 4);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(out.served_ranks(r), r);
  EXPECT_EQ(out.device_pages_per_rank(), 100u);
  EXPECT_EQ(out.host_pages_per_rank(), 300u);
  EXPECT_EQ(out.logical_device_pages(), 400u);
  EXPECT_EQ(out.host_layout(), v1::HOST_LAYOUT_PAGE_FIRST);
}

TEST(ProtoConvertTest, StatusCodesAndMessagesSurvive) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const grpc::Status s =
      ToGrpcStatus(absl::InvalidArgumentError("page_ids[3] out of range"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "page_ids[3] out of range");
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError("x")).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace hicache::service
