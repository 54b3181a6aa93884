#include "daemon/core/kv_layout.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace hicache {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxNameLength = 64;
constexpr std::streamsize kMaxFileBytes = 1 << 20;

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("KV layout: ", what));
}

bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// Only the keys in `allowed` (a typo is an error, not a default).
absl::Status OnlyKeys(const Json& object, absl::string_view where,
                      std::initializer_list<absl::string_view> allowed) {
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (absl::string_view a : allowed) known = known || key == a;
    if (!known) {
      return Bad(absl::StrCat("unknown key '", key, "' in ", where));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Count(const Json& object, absl::string_view where,
                               const char* key, bool required,
                               uint32_t fallback = 0) {
  auto it = object.find(key);
  if (it == object.end()) {
    if (required) return Bad(absl::StrCat(where, ": '", key, "' is missing"));
    return fallback;
  }
  // Integers only: 32.0 and -1 are refused, as is anything above 2^32 - 1.
  if (!it->is_number_unsigned() ||
      it->get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
    return Bad(absl::StrCat(where, ": '", key,
                            "' must be an integer in [0, 4294967295]"));
  }
  return static_cast<uint32_t>(it->get<uint64_t>());
}

absl::StatusOr<std::string> Text(const Json& object, absl::string_view where,
                                 const char* key, bool required,
                                 absl::string_view fallback = "") {
  auto it = object.find(key);
  if (it == object.end()) {
    if (required) return Bad(absl::StrCat(where, ": '", key, "' is missing"));
    return std::string(fallback);
  }
  if (!it->is_string()) {
    return Bad(absl::StrCat(where, ": '", key, "' must be a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<bool> Flag(const Json& object, absl::string_view where,
                          const char* key) {
  auto it = object.find(key);
  if (it == object.end()) return false;
  if (!it->is_boolean()) {
    return Bad(absl::StrCat(where, ": '", key, "' must be true or false"));
  }
  return it->get<bool>();
}

absl::StatusOr<std::vector<KvFamily>> ParseAttention(const Json& a) {
  constexpr absl::string_view kWhere = "attention";
  if (!a.is_object()) return Bad("'attention' must be an object");
  if (absl::Status s = OnlyKeys(a, kWhere,
                                {"layers", "kv_heads", "head_dim", "dtype",
                                 "tp_size", "draft_layers"});
      !s.ok()) {
    return s;
  }
  absl::StatusOr<uint32_t> layers = Count(a, kWhere, "layers", true);
  if (!layers.ok()) return layers.status();
  absl::StatusOr<uint32_t> heads = Count(a, kWhere, "kv_heads", true);
  if (!heads.ok()) return heads.status();
  absl::StatusOr<uint32_t> head_dim = Count(a, kWhere, "head_dim", true);
  if (!head_dim.ok()) return head_dim.status();
  absl::StatusOr<uint32_t> tp = Count(a, kWhere, "tp_size", false, 1);
  if (!tp.ok()) return tp.status();
  absl::StatusOr<uint32_t> draft_layers =
      Count(a, kWhere, "draft_layers", false, 0);
  if (!draft_layers.ok()) return draft_layers.status();
  absl::StatusOr<std::string> dtype = Text(a, kWhere, "dtype", false, "bf16");
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<uint32_t> dtype_bytes = KvDtypeBytes(*dtype);
  if (!dtype_bytes.ok()) return dtype_bytes.status();
  if (*tp == 0) return Bad("attention: 'tp_size' must be at least 1");
  if (*heads == 0) return Bad("attention: 'kv_heads' must be at least 1");
  const uint32_t worker_heads = (*heads + *tp - 1) / *tp;
  absl::StatusOr<std::vector<KvFamily>> families =
      AttentionFamilies(*layers, worker_heads, *head_dim, *dtype_bytes);
  if (!families.ok() || *draft_layers == 0) return families;
  absl::StatusOr<std::vector<KvFamily>> draft = AttentionFamilies(
      *draft_layers, worker_heads, *head_dim, *dtype_bytes, true, "draft_");
  if (!draft.ok()) return draft.status();
  families->insert(families->end(), draft->begin(), draft->end());
  return families;
}

absl::StatusOr<KvFamily> ParseFamily(const Json& f, size_t index) {
  const std::string where = absl::StrCat("families[", index, "]");
  if (!f.is_object()) return Bad(absl::StrCat(where, " must be an object"));
  if (absl::Status s =
          OnlyKeys(f, where, {"name", "bytes_per_token", "layers", "draft"});
      !s.ok()) {
    return s;
  }
  KvFamily family;
  absl::StatusOr<std::string> name = Text(f, where, "name", true);
  if (!name.ok()) return name.status();
  if (!IsValidName(*name)) {
    return Bad(absl::StrCat(where, ": name must be 1 to ", kMaxNameLength,
                            " characters of [A-Za-z0-9._-]"));
  }
  family.name = *name;
  absl::StatusOr<uint32_t> row = Count(f, where, "bytes_per_token", true);
  if (!row.ok()) return row.status();
  family.bytes_per_token = *row;
  absl::StatusOr<uint32_t> layers = Count(f, where, "layers", true);
  if (!layers.ok()) return layers.status();
  family.num_layers = *layers;
  absl::StatusOr<bool> draft = Flag(f, where, "draft");
  if (!draft.ok()) return draft.status();
  family.draft = *draft;
  return family;
}

}  // namespace

absl::StatusOr<uint32_t> KvDtypeBytes(absl::string_view dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "fp8") return 1;
  if (dtype == "fp32") return 4;
  return Bad(absl::StrCat("unknown dtype '", dtype,
                          "'; known: bf16, fp16, fp8, fp32"));
}

absl::StatusOr<std::vector<KvFamily>> AttentionFamilies(
    uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
    uint32_t dtype_bytes, bool draft, absl::string_view prefix) {
  const uint64_t row = uint64_t{kv_heads} * head_dim * dtype_bytes;
  if (layers == 0 || row == 0) {
    return Bad("attention: layers, kv_heads and head_dim must be at least 1");
  }
  if (row > std::numeric_limits<uint32_t>::max()) {
    return Bad(absl::StrCat("attention: a row of ", row, " bytes is too large"));
  }
  const uint32_t bytes = static_cast<uint32_t>(row);
  return std::vector<KvFamily>{
      {absl::StrCat(prefix, "k"), bytes, layers, draft},
      {absl::StrCat(prefix, "v"), bytes, layers, draft},
  };
}

absl::StatusOr<KvLayout> ParseKvLayout(absl::string_view json) {
  const Json root = Json::parse(json.begin(), json.end(), /*cb=*/nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return Bad("not valid JSON");
  if (!root.is_object()) return Bad("the top level must be an object");
  if (absl::Status s =
          OnlyKeys(root, "the layout", {"name", "attention", "families"});
      !s.ok()) {
    return s;
  }
  KvLayout layout;
  absl::StatusOr<std::string> name = Text(root, "the layout", "name", true);
  if (!name.ok()) return name.status();
  if (!IsValidName(*name)) {
    return Bad(absl::StrCat("name must be 1 to ", kMaxNameLength,
                            " characters of [A-Za-z0-9._-], got '", *name,
                            "'"));
  }
  layout.name = *name;
  if (auto it = root.find("attention"); it != root.end()) {
    absl::StatusOr<std::vector<KvFamily>> families = ParseAttention(*it);
    if (!families.ok()) return families.status();
    layout.families = *std::move(families);
  }
  if (auto it = root.find("families"); it != root.end()) {
    if (!it->is_array()) return Bad("'families' must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      absl::StatusOr<KvFamily> family = ParseFamily((*it)[i], i);
      if (!family.ok()) return family.status();
      layout.families.push_back(*std::move(family));
    }
  }
  if (layout.families.empty()) {
    return Bad("give 'attention' or a non-empty 'families'");
  }
  return layout;
}

absl::StatusOr<KvLayout> ReadKvLayoutFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot read KV layout file '", path,
                                         "': ", std::strerror(err));
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::NotFoundError(why);
  }
  std::string text(kMaxFileBytes + 1, '\0');
  in.read(text.data(), kMaxFileBytes + 1);
  if (in.gcount() > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV layout file '", path, "' is larger than ", kMaxFileBytes,
        " bytes"));
  }
  text.resize(static_cast<size_t>(in.gcount()));
  absl::StatusOr<KvLayout> layout = ParseKvLayout(text);
  if (!layout.ok()) {
    return absl::Status(layout.status().code(),
                        absl::StrCat(path, ": ", layout.status().message()));
  }
  return layout;
}

}  // namespace hicache
