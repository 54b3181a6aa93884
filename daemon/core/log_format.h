#pragma once

// fmt formatters for Abseil vocabulary types, so that spdlog calls can log
// absl::string_view and absl::Status directly:
//   spdlog::error("cannot start: {}", status);

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fmt/format.h"

template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(absl::string_view text, FormatContext& ctx) const {
    return fmt::formatter<fmt::string_view>::format(
        fmt::string_view(text.data(), text.size()), ctx);
  }
};

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<fmt::string_view> {
  template <typename FormatContext>
  auto format(const absl::Status& status, FormatContext& ctx) const {
    const std::string text = status.ToString();
    return fmt::formatter<fmt::string_view>::format(
        fmt::string_view(text.data(), text.size()), ctx);
  }
};
