// See options.h.
#include "launcher/cli/options.h"

#include <fmt/format.h>

#include "common/errors.h"

namespace dtrain::launcher {
namespace po = boost::program_options;

po::variables_map parse_options(const std::vector<std::string>& args, po::options_description& desc,
                                const std::vector<std::pair<const char*, std::string*>>& positional,
                                const char* command) {
  po::options_description all;
  all.add(desc);
  po::positional_options_description order;
  for (const auto& [name, target] : positional) {
    all.add_options()(name, po::value(target));
    order.add(name, 1);
  }
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(all).positional(order).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw common::ConfigError(
        fmt::format("{}: {} (see dtrain {} --help)", command, e.what(), command));
  }
  if (vm.count("help") == 0) {
    for (const auto& [name, target] : positional) {
      if (vm.count(name) == 0) {
        throw common::ConfigError(
            fmt::format("{}: missing argument {} (see dtrain {} --help)", command, name, command));
      }
    }
  }
  return vm;
}

}  // namespace dtrain::launcher
