// `dtrain launch --dry-run`: what a launch would start, task by task (where, in which folder,
// the command and every variable the launcher sets), as shell text a reader can copy. Secrets are
// masked. It starts nothing, binds nothing for long, and writes no file.
#pragma once

#include <string>

#include "common/job_spec.h"
#include "launcher/worker_env.h"

namespace dtrain::launcher {

/// What replaces a masked value.
inline constexpr const char* kMaskedValue = "********";

/// True for a variable whose value must not be printed: names holding TOKEN (DTRAIN_TOKEN too),
/// SECRET, PASS, CREDENTIAL, AUTH, APIKEY or COOKIE, or with KEY or PWD as a word after the
/// first (SSH_KEY, AWS_ACCESS_KEY_ID, MYSQL_PWD), in any case. The report shows other values with
/// the password of any scheme://user:password@host masked.
bool is_secret_name(const std::string& name);

/// The report for every task of context at the given attempt; run_in_use says a live launcher
/// holds the run directory now (a real launch would refuse).
std::string format_dry_run(const LaunchContext& context, int attempt, bool run_in_use);

/// `dtrain launch JOB --dry-run`: builds the context as a launch would, without creating the run
/// directory, and returns the report. Throws ConfigError as a launch does.
std::string dry_run(const common::JobSpec& spec);

}  // namespace dtrain::launcher
