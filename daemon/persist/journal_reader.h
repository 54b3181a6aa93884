#pragma once

// Loading the host-tier journal at start (docs/hot-restart.md §6 step 1).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/persist/journal_format.h"

namespace hicache::persist {

// What a journal holds once replayed.
struct LoadedJournal {
  JournalGeometry geometry;
  // The live Puts (Put and not Dropped later), every parent before its
  // children: a BFS from the namespace roots (parent 0), siblings in
  // persist_id order. A Put whose parent is not live, or whose parent is in
  // another namespace, is dropped with its subtree and counted in `orphans`.
  std::vector<PutRecord> puts;
  int64_t orphans = 0;
  // Records read (the Geometry included), Drops of ids that were not live
  // (harmless: counted), and whether the last record read is Clean (the
  // daemon stopped through Flush(clean) and wrote nothing after it).
  int64_t records = 0;
  int64_t unknown_drops = 0;
  bool clean = false;
  // The file ends at `valid_bytes` if `stop_reason` is empty. Otherwise the
  // first bad record starts at `valid_bytes`: a torn tail (the file ends
  // inside a record), a checksum mismatch, an impossible length, an unknown
  // type or a record that fails decoding or ValidatePut. Loading keeps every
  // record before it and ignores everything from it on (dropped_bytes); it
  // does not look for later good records, so a corrupt byte in the middle
  // loses the rest of the file.
  uint64_t file_bytes = 0;
  uint64_t valid_bytes = 0;
  uint64_t dropped_bytes = 0;
  std::string stop_reason;
  absl::Duration read_time;   // Reading the file.
  absl::Duration parse_time;  // Frames, decoding, replay and ordering.
};

// Loads <state_dir>/journal (see JournalPath).
//   NOT_FOUND: no journal.
//   FAILED_PRECONDITION: another format version, or `expected` is given and
//     the journal's geometry differs (the message names every field).
//   DATA_LOSS: a bad file header, or no valid Geometry record first.
//   Other codes: the file cannot be read.
// A damaged or torn later record is not an error: see LoadedJournal.
absl::StatusOr<LoadedJournal> LoadJournal(const std::string& state_dir,
                                          const JournalGeometry* expected);

// The same over bytes already in memory (tests, fuzzing). read_time is 0.
absl::StatusOr<LoadedJournal> LoadJournalBytes(absl::string_view bytes,
                                               const JournalGeometry* expected);

}  // namespace hicache::persist
