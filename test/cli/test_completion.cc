// `dtrain completion bash`: the checked-in script is the command's output, every option that a
// subcommand's --help lists is completed for it, and the script works in a real bash (sourced,
// COMP_WORDS/COMP_CWORD set, _dtrain called, COMPREPLY read) on a folder of job files and runs.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using dtrain::testing::binary;
using dtrain::testing::run_process;

namespace {

const std::string kCheckedIn = std::string(DTRAIN_SOURCE_DIR) + "/scripts/completion/dtrain.bash";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// COMPREPLY after sourcing the checked-in script and completing words (the last is the word
/// under the cursor) in cwd, sorted.
std::vector<std::string> complete(const std::vector<std::string>& words, const std::string& cwd) {
  std::vector<std::string> argv = {
      "/bin/bash",
      "--norc",
      "--noprofile",
      "-c",
      "source \"$0\" || exit 3; COMP_WORDS=(\"$@\"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); "
      "COMP_LINE=\"$*\"; COMP_POINT=${#COMP_LINE}; _dtrain || exit 4; "
      "printf '%s\\n' \"${COMPREPLY[@]}\"",
      kCheckedIn};
  argv.insert(argv.end(), words.begin(), words.end());
  dtrain::testing::ProcessOptions options;
  options.cwd = cwd;
  options.timeout_seconds = 30;
  auto r = run_process(argv, options);
  INFO("bash stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> reply;
  for (std::string& line : lines_of(r.out))
    if (!line.empty()) reply.push_back(line);
  std::sort(reply.begin(), reply.end());
  return reply;
}

/// The subcommands that `dtrain --help` lists.
std::vector<std::string> listed_commands() {
  auto help = run_process({binary("dtrain"), "--help"});
  REQUIRE(help.exit_code == 0);
  std::vector<std::string> commands;
  bool in_list = false;
  for (const std::string& line : lines_of(help.out)) {
    if (line == "Commands:") in_list = true;
    if (!in_list || line.rfind("  ", 0) != 0) continue;
    commands.push_back(line.substr(2, line.find(' ', 2) - 2));
  }
  return commands;
}

/// Every option name in the option column of `dtrain command --help` ("-f [ --follow ]").
std::set<std::string> help_options(const std::string& command) {
  auto help = run_process({binary("dtrain"), command, "--help"});
  REQUIRE(help.exit_code == 0);
  static const std::regex kName("(^|[ \\[])(--?[a-z][a-z0-9-]*)");
  std::set<std::string> names;
  for (const std::string& line : lines_of(help.out)) {
    size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos || line[start] != '-') continue;
    std::string column = line.substr(start, line.find("  ", start) - start);
    for (std::sregex_iterator it(column.begin(), column.end(), kName), end; it != end; ++it)
      names.insert((*it)[2].str());
  }
  return names;
}

using Words = std::vector<std::string>;

}  // namespace

TEST_CASE("scripts/completion/dtrain.bash is `dtrain completion bash`, byte for byte") {
  auto generated = run_process({binary("dtrain"), "completion", "bash"});
  REQUIRE(generated.exit_code == 0);
  CHECK(generated.out.find("complete -F _dtrain dtrain") != std::string::npos);
  INFO("regenerate with: dtrain completion bash > scripts/completion/dtrain.bash");
  CHECK(slurp(kCheckedIn) == generated.out);
}

TEST_CASE("every subcommand and every option its --help lists is completed") {
  dtrain::testing::TempDir cwd;
  std::vector<std::string> commands = listed_commands();
  REQUIRE(commands.size() >= 9);
  std::vector<std::string> offered = complete({"dtrain", ""}, cwd.path());
  for (const std::string& command : commands) {
    INFO("command: " << command);
    CHECK(std::count(offered.begin(), offered.end(), command) == 1);
    std::set<std::string> in_help = help_options(command);
    CHECK(in_help.count("--help") == 1);
    std::vector<std::string> options = complete({"dtrain", command, "-"}, cwd.path());
    for (const std::string& option : in_help) {
      INFO("option: " << option);
      CHECK(std::count(options.begin(), options.end(), option) == 1);
    }
  }
}

TEST_CASE("bash completes subcommands, options, job files, run directories and values") {
  dtrain::testing::TempDir cwd;
  for (const char* dir : {"runs/alpha", "runs/beta", "configs"})
    std::filesystem::create_directories(cwd.path() + "/" + dir);
  for (const char* file : {"job.json", "notes.txt"}) std::ofstream(cwd.path() + "/" + file);
  std::string at = cwd.path();

  CHECK(complete({"dtrain", "lo"}, at) == Words{"logs"});
  CHECK(complete({"dtrain", "st"}, at) == Words{"status", "stop"});
  CHECK(complete({"dtrain", "logs", "--gr"}, at) == Words{"--grep"});
  CHECK(complete({"dtrain", "logs", "-f", "--s"}, at) == Words{"--since"});
  CHECK(complete({"dtrain", "launch", "--d"}, at) == Words{"--detach", "--dry-run"});
  CHECK(complete({"dtrain", "stop", "--"}, at) == Words{"--help", "--now", "--timeout"});
  CHECK(complete({"dtrain", "logs", ""}, at) ==
        Words{"configs", "job.json", "runs", "runs/alpha", "runs/beta"});
  CHECK(complete({"dtrain", "status", "runs/a"}, at) == Words{"runs/alpha"});
  CHECK(complete({"dtrain", "launch", ""}, at) == Words{"configs", "job.json", "runs"});
  CHECK(complete({"dtrain", "validate", "j"}, at) == Words{"job.json"});
  CHECK(complete({"dtrain", "launch", "--run-dir", ""}, at) == Words{"configs", "runs"});
  CHECK(complete({"dtrain", "logs", "--since", ""}, at).empty());
  CHECK(complete({"dtrain", "logs", "--worker", "1", "runs/b"}, at) == Words{"runs/beta"});
  CHECK(complete({"dtrain", "completion", ""}, at) == Words{"bash"});
  CHECK(complete({"dtrain", "nonsense", ""}, at).empty());
}

TEST_CASE("dtrain completion with no shell or another shell is exit 2 with one line") {
  auto none = run_process({binary("dtrain"), "completion"});
  CHECK(none.exit_code == 2);
  CHECK(none.out.empty());
  CHECK(std::count(none.err.begin(), none.err.end(), '\n') == 1);
  auto zsh = run_process({binary("dtrain"), "completion", "zsh"});
  CHECK(zsh.exit_code == 2);
  CHECK(zsh.err.find("\"zsh\"") != std::string::npos);
  auto help = run_process({binary("dtrain"), "completion", "--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("source <(dtrain completion bash)") != std::string::npos);
}
