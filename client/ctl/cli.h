#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace hicache::ctl {

// Process exit codes of hicachectl (documented in --help and
// docs/hicachectl.md).
inline constexpr int kExitOk = 0;       // The command succeeded.
inline constexpr int kExitFailure = 1;  // Daemon unreachable, RPC error, or
                                        // not serving.
inline constexpr int kExitUsage = 2;    // Bad command line.

// The --help text.
std::string UsageText();

// Runs hicachectl with `args` (argv without the program name). Writes results
// to `out` and diagnostics to `err`; returns the process exit code. Global
// options may come before or after the command; unknown options and bad
// values exit 2 with a message that names the option. Never throws.
int RunCli(const std::vector<std::string>& args, std::ostream& out,
           std::ostream& err);

}  // namespace hicache::ctl
