#include "client/ctl/output_format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"

namespace hicache::ctl {
namespace {

using google::protobuf::Message;

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
  absl::StrAppendFormat(
      &out, "hicached %s (git %s, %s, %s, cuda %s, api %s)\n", build.version(),
      build.git_revision().empty() ? "unknown" : build.git_revision(),
      build.compiler(), build.build_mode(),
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
  if (stats.has_cp_group()) out += FormatCpGroupHuman(stats.cp_group());
  return out;
}

std::string FormatRankRanges(
    const google::protobuf::RepeatedField<uint32_t>& ranks) {
  std::vector<uint32_t> sorted(ranks.begin(), ranks.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (sorted.empty()) return "none";
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < sorted.size()) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(sorted[i])
                           : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

std::string FormatCpGroupHuman(const v1::CpGroupStatus& group) {
  // The daemon's strings are shown escaped: a name must not move the
  // terminal's cursor or forge lines.
  auto text = [](const std::string& s, const char* empty) {
    return s.empty() ? std::string(empty) : absl::CHexEscape(s);
  };
  std::string out = "CP group:\n";
  absl::StrAppendFormat(&out, "  %-12s %s\n", "name:", text(group.name(), "-"));
  absl::StrAppendFormat(&out, "  %-12s %s\n", "role:", text(group.role(), "-"));
  absl::StrAppendFormat(&out, "  %-12s %s\n", "state:",
                        text(group.state(), "-"));
  absl::StrAppendFormat(&out, "  %-12s %u (cp size %u)\n", "epoch:",
                        group.epoch(), group.cp_size());
  absl::StrAppendFormat(&out, "  %-12s %s\n", "leader:",
                        text(group.leader_address(), "unknown"));
  if (group.deaths() > 0) {
    absl::StrAppendFormat(&out, "  %-12s %d\n", "deaths:", group.deaths());
  }
  if (!group.reason().empty()) {
    absl::StrAppendFormat(&out, "  %-12s %s\n", "reason:",
                          text(group.reason(), ""));
  }
  if (group.members_size() == 0) {
    out += "  members:     none\n";
    return out;
  }
  struct Row {
    std::string index, name, ranks, health, heard, readmissions, reason;
  };
  std::vector<Row> rows;
  rows.push_back(
      {"#", "NAME", "RANKS", "HEALTH", "HEARD", "READMITS", "REASON"});
  for (const v1::CpGroupMember& m : group.members()) {
    rows.push_back(
        {absl::StrCat(m.index()), text(m.name(), "-"),
         FormatRankRanges(m.ranks()), text(m.health(), "-"),
         m.last_heard_age_ms() > 0
             ? absl::StrCat(absl::FormatDuration(
                                absl::Milliseconds(m.last_heard_age_ms())),
                            " ago")
             : std::string("-"),
         absl::StrCat(m.readmissions()), text(m.reason(), "")});
  }
  int w[6] = {0, 0, 0, 0, 0, 0};
  for (const Row& r : rows) {
    const std::string* cols[6] = {&r.index,  &r.name,  &r.ranks,
                                  &r.health, &r.heard, &r.readmissions};
    for (int k = 0; k < 6; ++k) {
      w[k] = std::max(w[k], static_cast<int>(cols[k]->size()));
    }
  }
  out += "  members:\n";
  for (const Row& r : rows) {
    std::string line = absl::StrFormat(
        "    %-*s  %-*s  %-*s  %-*s  %-*s  %-*s", w[0], r.index, w[1], r.name,
        w[2], r.ranks, w[3], r.health, w[4], r.heard, w[5], r.readmissions);
    absl::StrAppend(&line, "  ", r.reason);
    // No trailing blanks.
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  // "last match 1.5s ago" / "no match yet" (-1 or unset: never).
  auto last_match = [](int64_t age_ms) {
    return age_ms < 0 ? std::string("no match yet")
                      : absl::StrCat("last match ",
                                     absl::FormatDuration(
                                         absl::Milliseconds(age_ms)),
                                     " ago");
  };
  // Leader: the data path to each member (its transfer engine and the
  // worker events forwarded to it).
  bool data_path = false;
  for (const v1::CpGroupMember& m : group.members()) {
    if (!m.has_transfer() && !m.has_events()) continue;
    if (!data_path) {
      out += "  data path:\n";
      data_path = true;
    }
    std::string line = absl::StrCat("    ", m.index(), "  ");
    if (m.has_transfer()) {
      const v1::CpGroupMemberTransfer& t = m.transfer();
      absl::StrAppendFormat(
          &line,
          "steps %d sent, %d done, %d failed, %d outstanding, %d timeouts; "
          "digests %d sent, %d matched, %d diverged (%s)",
          t.steps_sent(), t.steps_completed(), t.steps_failed(),
          t.outstanding(), t.step_timeouts(), t.digests_sent(),
          t.digests_matched(), t.digest_divergences(),
          last_match(t.last_digest_match_age_ms()));
    }
    if (m.has_events()) {
      const v1::CpGroupMemberEvents& e = m.events();
      absl::StrAppendFormat(&line,
                            "%sevents %d sent in %d frames, %d waiting%s",
                            m.has_transfer() ? "; " : "", e.events_sent(),
                            e.frames_sent(), e.events_waiting(),
                            e.failed() ? " (FAILED)" : "");
    }
    absl::StrAppend(&out, line, "\n");
  }
  // Follower: what its executor ran for the leader, and the relayed acks.
  if (group.has_follower()) {
    const v1::CpGroupFollowerStats& f = group.follower();
    absl::StrAppendFormat(
        &out,
        "  %-12s %d tasks; steps %d executed, %d refused, %d rejected, %d "
        "pending; digests %d checked, %d matched (%s)%s\n",
        "executor:", f.tasks_received(), f.steps_executed(), f.steps_refused(),
        f.steps_rejected(), f.pending(), f.digests_checked(),
        f.digests_matched(), last_match(f.last_digest_match_age_ms()),
        f.diverged() ? "; DIVERGED" : "");
    absl::StrAppendFormat(&out, "  %-12s %d relayed, %d failed\n",
                          "worker acks:", f.acks_relayed(), f.acks_failed());
  }
  return out;
}

Json StatsToJson(const v1::GetStatsResponse& stats) {
  // An unset cp_group (a standalone daemon) and the parts of it a daemon
  // did not fill (a leader's `follower`, a row's `transfer` or `events`)
  // are unset messages, which the printer leaves out.
  return ProtoToJson(stats);
}

Json ProtoToJson(const Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  if (!google::protobuf::util::MessageToJsonString(message, &text, options)
           .ok()) {
    // Only a message holding invalid UTF-8 in a string field gets here (the
    // daemon's strings are its own): say so instead of failing the command.
    return Json{{"error", "the reply cannot be printed as JSON"},
                {"text", message.ShortDebugString()}};
  }
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {  // Impossible: protobuf prints valid JSON.
    return Json{{"error", "protobuf printed invalid JSON"}, {"text", text}};
  }
  return json;
}

std::string JsonLine(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace hicache::ctl
