// `dtrain completion bash`: prints a bash completion script generated from one table of each
// subcommand's options and operand, with the subcommand names taken from all_commands(), so
// the two cannot drift apart (test_cli compares the table with each command's --help). Bash
// only; the script is also checked in as scripts/completion/dtrain.bash.
#include <fmt/format.h>

#include <boost/program_options.hpp>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "launcher/cli/commands.h"
#include "launcher/cli/options.h"

namespace dtrain::launcher {
namespace {

namespace po = boost::program_options;

/// What follows an option on the command line.
enum class Value { kNone, kAny, kDirectory };

/// What the positional argument of a command names.
enum class Operand { kNone, kJobFile, kRunOrJob, kShell };

struct OptionSpec {
  const char* name;
  Value value = Value::kNone;
};

struct CommandSpec {
  const char* command;
  Operand operand;
  std::vector<OptionSpec> options;  ///< besides -h and --help, which every command has
};

/// Every subcommand's options. A command missing here is completed with -h/--help only.
const std::vector<CommandSpec>& command_specs() {
  static const std::vector<CommandSpec> specs = {
      {"launch",
       Operand::kJobFile,
       {{"--run-dir", Value::kDirectory},
        {"--detach"},
        {"--metrics-port", Value::kAny},
        {"--dry-run"},
        {"--fresh"}}},
      {"logs",
       Operand::kRunOrJob,
       {{"-f"},
        {"--follow"},
        {"--worker", Value::kAny},
        {"--task", Value::kAny},
        {"-n", Value::kAny},
        {"--lines", Value::kAny},
        {"--raw"},
        {"--since", Value::kAny},
        {"--grep", Value::kAny}}},
      {"status", Operand::kRunOrJob, {{"--json"}}},
      {"generate",
       Operand::kRunOrJob,
       {{"--prompt", Value::kAny},
        {"--tokens", Value::kAny},
        {"--temperature", Value::kAny},
        {"--top-k", Value::kAny},
        {"--seed", Value::kAny}}},
      {"evaluate",
       Operand::kRunOrJob,
       {{"--data", Value::kAny}, {"--labels", Value::kAny}, {"--json"}}},
      {"predict", Operand::kRunOrJob, {{"--input", Value::kAny}, {"--output", Value::kAny}}},
      {"stop", Operand::kRunOrJob, {{"--now"}, {"--timeout", Value::kAny}}},
      {"validate", Operand::kJobFile, {}},
      {"tf-config", Operand::kJobFile, {{"--task", Value::kAny}}},
      {"slurm-script", Operand::kJobFile, {}},
      {"agent",
       Operand::kNone,
       {{"--request-timeout", Value::kAny},
        {"--keepalive", Value::kAny},
        {"--signal-grace", Value::kAny}}},
      {"completion", Operand::kShell, {}},
  };
  return specs;
}

const CommandSpec* find_spec(const std::string& command) {
  for (const CommandSpec& spec : command_specs()) {
    if (spec.command == command) return &spec;
  }
  return nullptr;
}

const char* operand_name(Operand operand) {
  switch (operand) {
    case Operand::kJobFile:
      return "job";
    case Operand::kRunOrJob:
      return "run";
    case Operand::kShell:
      return "shell";
    case Operand::kNone:
      break;
  }
  return "none";
}

/// Space-separated names of spec's options whose value is value (all options for nullopt).
std::string option_names(const CommandSpec& spec, std::optional<Value> value) {
  std::string names = value ? "" : "-h --help";
  for (const OptionSpec& option : spec.options) {
    if (value && option.value != *value) continue;
    if (!names.empty()) names += ' ';
    names += option.name;
  }
  return names;
}

/// One `case` branch of _dtrain for a subcommand.
std::string case_branch(const std::string& command) {
  CommandSpec fallback{"", Operand::kNone, {}};
  const CommandSpec* spec = find_spec(command);
  if (spec == nullptr) spec = &fallback;
  return fmt::format(
      "    {})\n      opts=\"{}\"\n      value_opts=\"{}\"\n      dir_opts=\"{}\"\n"
      "      operand={}\n      ;;\n",
      command, option_names(*spec, std::nullopt), option_names(*spec, Value::kAny),
      option_names(*spec, Value::kDirectory), operand_name(spec->operand));
}

constexpr const char* kHead = R"bash(# bash completion for dtrain, made by `dtrain completion bash`.
# Do not edit by hand: scripts/completion/dtrain.bash is a copy that test_cli compares with
# the command's output.
# Install: dtrain completion bash > /etc/bash_completion.d/dtrain
#      or: source <(dtrain completion bash)

# Adds the words of a newline-separated list to COMPREPLY, each once.
_dtrain_add() {
  local word seen
  while IFS= read -r word; do
    [[ -z $word ]] && continue
    for seen in "${COMPREPLY[@]}"; do
      [[ $seen == "$word" ]] && continue 2
    done
    COMPREPLY+=("$word")
  done <<< "$1"
}

# Job files (*.json) and directories that start with $1.
_dtrain_job_files() {
  _dtrain_add "$(compgen -f -X '!*.json' -- "$1")"
  _dtrain_add "$(compgen -d -- "$1")"
  compopt -o filenames 2> /dev/null
}

# Run directories under ./runs that start with $1, then job files and directories.
_dtrain_runs() {
  local dir
  for dir in runs/*/; do
    [[ -d $dir && ${dir%/} == "$1"* ]] && _dtrain_add "${dir%/}"
  done
  _dtrain_job_files "$1"
}

_dtrain() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=""
  local opts="" value_opts="" dir_opts="" operand=none
  COMPREPLY=()
  (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD - 1]}
  if (( COMP_CWORD == 1 )); then
    _dtrain_add "$(compgen -W ")bash";

constexpr const char* kMiddle = R"bash(" -- "$cur")"
    return 0
  fi
  case ${COMP_WORDS[1]} in
)bash";

constexpr const char* kTail = R"bash(    *)
      return 0
      ;;
  esac
  if [[ " $dir_opts " == *" $prev "* ]]; then
    _dtrain_add "$(compgen -d -- "$cur")"
    compopt -o filenames 2> /dev/null
    return 0
  fi
  [[ " $value_opts " == *" $prev "* ]] && return 0
  if [[ $cur == -* ]]; then
    _dtrain_add "$(compgen -W "$opts" -- "$cur")"
    return 0
  fi
  case $operand in
    job) _dtrain_job_files "$cur" ;;
    run) _dtrain_runs "$cur" ;;
    shell) _dtrain_add "$(compgen -W "bash" -- "$cur")" ;;
  esac
  return 0
}

complete -F _dtrain dtrain
)bash";

/// The whole script.
std::string bash_script() {
  std::string commands;
  std::string branches;
  for (const Command& c : all_commands()) {
    commands += std::string(c.name) + " ";
    branches += case_branch(c.name);
  }
  return kHead + commands + "--help --version" + kMiddle + branches + kTail;
}

}  // namespace

int completion_command(const Args& args) {
  std::string shell;
  po::options_description desc(
      "Usage: dtrain completion bash\n\n"
      "Prints a bash completion script for dtrain: subcommands, their options, job files\n"
      "(*.json) and run directories under ./runs. Install it with\n"
      "  dtrain completion bash > /etc/bash_completion.d/dtrain\n"
      "or load it into the current shell with\n"
      "  source <(dtrain completion bash)\n\n"
      "Options");
  desc.add_options()("help,h", "show this help");
  po::variables_map vm = parse_options(args, desc, {{"shell", &shell}}, "completion");
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (shell != "bash") {
    throw common::ConfigError(fmt::format(
        "completion: shell \"{}\" is not supported; only bash is (dtrain completion bash)", shell));
  }
  std::cout << bash_script();
  return 0;
}

}  // namespace dtrain::launcher
