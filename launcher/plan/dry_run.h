// `dtrain launch --dry-run`: what a launch would start, task by task (where, in which folder,
// the command and every variable the launcher sets), as shell text a reader can copy. Secrets are
// masked. It starts nothing, binds nothing for long, and writes no file.
#pragma once

#include <string>

#include "common/job_spec.h"
#include "launcher/plan/worker_env.h"

namespace dtrain::launcher {

/// What replaces a masked value.
inline constexpr const char* kMaskedValue = "********";

/// True for a variable whose value must not be printed: names holding TOKEN (DTRAIN_TOKEN too),
/// SECRET, PASS, CREDENTIAL, AUTH, APIKEY or COOKIE, or with KEY or PWD as a word after the
/// first (SSH_KEY, AWS_ACCESS_KEY_ID, MYSQL_PWD), in any case. Other values and every command
/// argument are shown through mask_secrets_in().
bool is_secret_name(const std::string& name);

/// value with the secrets inside it masked, the rest readable: the password of
/// scheme://user:password@host, the user part of scheme://TOKEN@host (not for ssh, sftp, scp,
/// rsync, where it is a login), and the value of a NAME=value field (a query parameter, a
/// connection-string field, an --option=value) whose NAME is a secret name or ends in Key or
/// Signature camel-cased, or is key, sig, pwd or passwd: `?password=x`, `AccountKey=k==;`.
std::string mask_secrets_in(const std::string& value);

/// What a dry run knows of the run directory besides the plan.
struct DryRunFacts {
  int attempt = 0;         ///< the attempt a launch would start
  bool in_use = false;     ///< a live launcher holds the run directory (a launch would refuse)
  bool succeeded = false;  ///< the run already succeeded (a launch would change nothing)
  bool fresh = false;      ///< --fresh: the run's results would be removed first
  /// What a launch would do with the run's earlier work (RunStart::what): "continues the
  /// finished run from epoch 3 to epoch 5 ...", "resumes from ...", "starts from scratch".
  std::string start;
};

/// The report for every task of plan.
std::string format_dry_run(const LaunchPlan& plan, const DryRunFacts& facts);

/// `dtrain launch JOB --dry-run [--fresh]`: plans as a launch would, without creating the run
/// directory, and returns the report. Throws ConfigError as a launch does.
std::string dry_run(const common::JobSpec& spec, bool fresh = false);

}  // namespace dtrain::launcher
