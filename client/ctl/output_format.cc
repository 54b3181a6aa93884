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

namespace hicache::ctl {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

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

Json Int64Json(int64_t v) {
  if (v >= -kMaxExactJsonInteger && v <= kMaxExactJsonInteger) return v;
  return absl::StrCat(v);
}

Json Uint64Json(uint64_t v) {
  if (v <= static_cast<uint64_t>(kMaxExactJsonInteger)) return v;
  return absl::StrCat(v);
}

Json DoubleJson(double v) {
  // JSON has no NaN or infinities; protobuf's JSON mapping spells them so.
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// One value of `field`: element `index` of a repeated field, or the single
// value when index < 0.
Json FieldValue(const Message& m, const Reflection* r, const FieldDescriptor* f,
                int index) {
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return Int64Json(rep ? r->GetRepeatedInt64(m, f, index)
                           : r->GetInt64(m, f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return Uint64Json(rep ? r->GetRepeatedUInt64(m, f, index)
                            : r->GetUInt64(m, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return DoubleJson(rep ? r->GetRepeatedDouble(m, f, index)
                            : r->GetDouble(m, f));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return DoubleJson(rep ? r->GetRepeatedFloat(m, f, index)
                            : r->GetFloat(m, f));
    case FieldDescriptor::CPPTYPE_BOOL:
      return rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int number =
          rep ? r->GetRepeatedEnumValue(m, f, index) : r->GetEnumValue(m, f);
      const auto* value = f->enum_type()->FindValueByNumber(number);
      if (value == nullptr) return number;  // Unknown to this build.
      return value->name();
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s =
          rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      if (f->type() == FieldDescriptor::TYPE_BYTES) {
        return absl::Base64Escape(s);
      }
      return s;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToJson(rep ? r->GetRepeatedMessage(m, f, index)
                             : r->GetMessage(m, f));
  }
  return nullptr;
}

// A map entry's key as a JSON object key.
std::string MapKey(const Message& entry) {
  const Reflection* r = entry.GetReflection();
  const FieldDescriptor* key = entry.GetDescriptor()->map_key();
  const Json value = FieldValue(entry, r, key, -1);
  return value.is_string() ? value.get<std::string>() : value.dump();
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
  Json json = ProtoToJson(stats);
  if (!stats.has_cp_group()) {
    json.erase("cp_group");
    return json;
  }
  // Like cp_group itself: the parts a daemon did not fill are left out
  // rather than shown as zeros (a leader has no `follower`, the leader's own
  // row and a follower's rows no `transfer` or `events`).
  const v1::CpGroupStatus& g = stats.cp_group();
  Json& group = json["cp_group"];
  if (!g.has_follower()) group.erase("follower");
  if (group.contains("members") && group["members"].is_array()) {
    for (int i = 0; i < g.members_size() &&
                    i < static_cast<int>(group["members"].size());
         ++i) {
      if (!g.members(i).has_transfer()) group["members"][i].erase("transfer");
      if (!g.members(i).has_events()) group["members"][i].erase("events");
    }
  }
  return json;
}

Json ProtoToJson(const Message& message) {
  const google::protobuf::Descriptor* d = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  Json object = Json::object();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_map()) {
      Json map = Json::object();
      for (int j = 0; j < r->FieldSize(message, f); ++j) {
        const Message& entry = r->GetRepeatedMessage(message, f, j);
        map[MapKey(entry)] = FieldValue(entry, entry.GetReflection(),
                                        entry.GetDescriptor()->map_value(), -1);
      }
      object[f->name()] = std::move(map);
    } else if (f->is_repeated()) {
      Json array = Json::array();
      for (int j = 0; j < r->FieldSize(message, f); ++j) {
        array.push_back(FieldValue(message, r, f, j));
      }
      object[f->name()] = std::move(array);
    } else if (f->real_containing_oneof() != nullptr &&
               !r->HasField(message, f)) {
      continue;  // Only the oneof member that is set.
    } else {
      object[f->name()] = FieldValue(message, r, f, -1);
    }
  }
  return object;
}

std::string JsonLine(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace hicache::ctl
