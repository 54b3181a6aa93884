// hicachectl: command-line tool for hicached. See `hicachectl --help` and
// docs/hicachectl.md.
#include <iostream>
#include <string>
#include <vector>

#include "client/ctl/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return hicache::ctl::RunCli(args, std::cout, std::cerr);
}
