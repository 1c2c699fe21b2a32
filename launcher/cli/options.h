// Shared Boost.Program_options plumbing for the subcommands: positional arguments by name, and
// option errors turned into ConfigError that say which subcommand to ask for --help.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::launcher {

/// Parses args against desc plus the named positional arguments (each required unless --help is
/// given). Throws ConfigError "<command>: <problem> (see dtrain <command> --help)".
boost::program_options::variables_map parse_options(
    const std::vector<std::string>& args, boost::program_options::options_description& desc,
    const std::vector<std::pair<const char*, std::string*>>& positional, const char* command);

}  // namespace dtrain::launcher
