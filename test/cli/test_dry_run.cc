// `dtrain launch --dry-run` through the real binary: every task's command and variables (TF_CONFIG,
// torchrun's, the job's env) with secrets masked, a remote task as its ssh command plus what the
// agent runs, and nothing started or written. Also the masking rule on its own.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "launcher/plan/dry_run.h"
#include "launcher/plan/run_preparation.h"
#include "test/support/subprocess.h"
#include "test/support/temp_dir.h"

using dtrain::testing::binary;
using dtrain::testing::run_process;
namespace fs = std::filesystem;

namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A command job on two local workers and one on a host that is not this machine.
void write_job(const std::string& path, const std::string& run_dir, const std::string& hosts) {
  std::ofstream(path) << R"({"job": "dry", "run_dir": ")" << run_dir << R"(",
    "cluster": {"worker": [)"
                      << hosts << R"(]},
    "command": ["python3", "train.py", "--lr", "0.1 0.2"],
    "env": {"WANDB_API_KEY": "key-123-secret", "HF_TOKEN": "hf_abc", "MY_FLAG": "on",
            "DATABASE_URL": "postgres://me:hunter2@db:5432/x?ssl=1 http://a@b/ https://u:p@q"}})";
}

}  // namespace

TEST_CASE("which variables are secrets") {
  using dtrain::launcher::is_secret_name;
  for (const char* name :
       {"DTRAIN_TOKEN", "HF_TOKEN", "WANDB_API_KEY", "aws_secret_access_key", "DB_PASSWORD",
        "AWS_ACCESS_KEY_ID", "GOOGLE_CREDENTIALS", "DB_PASS", "PGPASSFILE", "MYSQL_PWD", "SSH_KEY",
        "ENCRYPTION_KEY", "BASIC_AUTH", "OAUTH_CLIENT", "SESSION_COOKIE", "SIGNING_KEY_PEM"})
    CHECK(is_secret_name(name));
  for (const char* name : {"TF_CONFIG", "RANK", "MASTER_PORT", "PATH", "MY_FLAG", "KEYBOARD", "PWD",
                           "KEY", "MONKEY_COUNT"})
    CHECK_FALSE(is_secret_name(name));
}

TEST_CASE("launch --dry-run prints each task's command and variables and starts nothing") {
  dtrain::testing::TempDir dir;
  std::string run = dir.path() + "/runs/dry";
  std::string job = dir.path() + "/job.json";
  write_job(job, run, R"("localhost:12345", "127.0.0.1:12346")");
  auto r = run_process({binary("dtrain"), "launch", job, "--dry-run"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("2 task(s)") != std::string::npos);
  CHECK(r.out.find("worker:0 localhost:12345 on localhost (this machine)") != std::string::npos);
  CHECK(r.out.find("TF_CONFIG='{\"cluster\": {\"worker\": [\"localhost:12345\", "
                   "\"127.0.0.1:12346\"]}, \"task\": {\"type\": \"worker\", \"index\": 1}}'") !=
        std::string::npos);
  CHECK(r.out.find("    RANK=0 \\\n") != std::string::npos);
  CHECK(r.out.find("    RANK=1 \\\n") != std::string::npos);
  CHECK(count(r.out, "    WORLD_SIZE=2 \\\n") == 2);
  CHECK(count(r.out, "MASTER_ADDR=localhost") == 2);
  CHECK(count(r.out, "MASTER_PORT=") == 2);
  CHECK(count(r.out, "    MY_FLAG=on \\\n") == 2);
  CHECK(count(r.out, "    python3 train.py --lr '0.1 0.2'\n") == 2);
  CHECK(count(r.out, "cd " + fs::current_path().string() + " && env") == 2);
  // Secrets: the job's and the launcher's token, never in the output.
  CHECK(r.out.find("key-123-secret") == std::string::npos);
  CHECK(r.out.find("hf_abc") == std::string::npos);
  CHECK(count(r.out, "WANDB_API_KEY=********") == 2);
  CHECK(count(r.out, "DTRAIN_TOKEN=********") == 2);
  // Passwords inside URLs: the rest of the value stays readable.
  CHECK(r.out.find("hunter2") == std::string::npos);
  CHECK(count(r.out,
              "DATABASE_URL='postgres://me:********@db:5432/x?ssl=1 http://********@b/ "
              "https://u:********@q'") == 2);
  // Nothing written, nothing started.
  CHECK_FALSE(fs::exists(dir.path() + "/runs"));
}

// Issue 25 (18): the four forms of a secret inside a value that a dry run showed.
constexpr const char* kUrlPassword = "postgres://me:hunter2@db:5432/x";
constexpr const char* kTokenUrl = "https://ghp_tok3n@github.com/org/repo.git";
constexpr const char* kQueryPassword = "https://db.example/x?user=me&password=s3cr3t&ssl=1";
constexpr const char* kAzure =
    "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=YWJj+ZGVm==;EndpointSuffix=core."
    "windows.net";

TEST_CASE("secrets inside values are masked, the rest stays readable") {
  using dtrain::launcher::mask_secrets_in;
  CHECK(mask_secrets_in(kUrlPassword) == "postgres://me:********@db:5432/x");
  CHECK(mask_secrets_in(kTokenUrl) == "https://********@github.com/org/repo.git");
  CHECK(mask_secrets_in(kQueryPassword) == "https://db.example/x?user=me&password=********&ssl=1");
  CHECK(mask_secrets_in(kAzure) ==
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=********;EndpointSuffix=core."
        "windows.net");
  CHECK(mask_secrets_in("--api-key=abc --db-password=x") ==
        "--api-key=******** --db-password=********");
  CHECK(mask_secrets_in("https://h/?sig=abc%2F&sv=2020") == "https://h/?sig=********&sv=2020");
  // Ordinary values, logins included, stay as they are.
  for (const char* plain : {"ssh://git@github.com/org/repo.git", "https://github.com/org/repo.git",
                            "--lr=0.1", "a=b;c=d", "user@example.com", "--monkey=3", "KEYBOARD=us",
                            "https://h/x?ssl=1&page=2", "0.1 0.2", "/usr/bin:/bin"})
    CHECK(mask_secrets_in(plain) == plain);
}

TEST_CASE("launch --dry-run masks secrets in the command's arguments as in its env") {
  dtrain::testing::TempDir dir;
  std::string job = dir.path() + "/job.json";
  std::ofstream(job) << R"({"job": "dry", "run_dir": ")" << dir.path() << R"(/run",
    "cluster": {"worker": ["localhost:12345"]},
    "command": ["python3", "train.py", ")"
                     << kUrlPassword << R"(", ")" << kTokenUrl << R"(", "--db", ")"
                     << kQueryPassword << R"(", ")" << kAzure << R"(", "--lr", "0.1"],
    "env": {"A": ")" << kUrlPassword
                     << R"(", "B": ")" << kTokenUrl << R"(", "C": ")" << kQueryPassword
                     << R"(", "D": ")" << kAzure << R"("}})";
  auto r = run_process({binary("dtrain"), "launch", job, "--dry-run"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  for (const char* secret : {"hunter2", "ghp_tok3n", "s3cr3t", "YWJj"})
    CHECK(r.out.find(secret) == std::string::npos);
  // Each form masked twice: once in env, once in argv; the rest readable.
  CHECK(count(r.out, "postgres://me:********@db:5432/x") == 2);
  CHECK(count(r.out, "https://********@github.com/org/repo.git") == 2);
  CHECK(count(r.out, "?user=me&password=********&ssl=1") == 2);
  CHECK(count(r.out, "AccountName=acct;AccountKey=********;EndpointSuffix=core.windows.net") == 2);
  CHECK(r.out.find(" --lr 0.1\n") != std::string::npos);
}

TEST_CASE("launch --dry-run shows a task on another host as its ssh command and the agent's") {
  dtrain::testing::TempDir dir;
  std::string job = dir.path() + "/job.json";
  write_job(job, dir.path() + "/run", R"("localhost:12345", "gpu-node-7.invalid:2222")");
  auto r = run_process({binary("dtrain"), "launch", job, "--dry-run"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("worker:1 gpu-node-7.invalid:2222 on gpu-node-7.invalid (over ssh)") !=
        std::string::npos);
  CHECK(r.out.find("  ssh -- gpu-node-7.invalid ") != std::string::npos);
  CHECK(r.out.find(" agent --keepalive ") != std::string::npos);
  CHECK(r.out.find("  what `dtrain agent` runs there (sent on its stdin):\n    cd ") !=
        std::string::npos);
  CHECK(r.out.find("      RANK=1 \\\n") != std::string::npos);
  CHECK(r.out.find("      GROUP_RANK=1 \\\n") != std::string::npos);
  CHECK(r.out.find("key-123-secret") == std::string::npos);
  CHECK_FALSE(fs::exists(dir.path() + "/run"));
}

TEST_CASE("launch --dry-run refuses --detach and bad job files like a launch") {
  dtrain::testing::TempDir dir;
  std::string job = dir.path() + "/job.json";
  write_job(job, dir.path() + "/run", R"("localhost:12345")");
  auto both = run_process({binary("dtrain"), "launch", job, "--dry-run", "--detach"});
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("--dry-run or --detach") != std::string::npos);
  std::ofstream(job) << R"({"job": "dry", "cluster": {"worker": ["localhost:99999"]}})";
  auto bad = run_process({binary("dtrain"), "launch", job, "--dry-run"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("99999") != std::string::npos);
  CHECK(bad.out.empty());
}

TEST_CASE("a run directory is in use while a launcher holds its lock; the check takes none") {
  dtrain::testing::TempDir dir;
  dtrain::common::RunDir run(dir.path());
  CHECK_FALSE(dtrain::launcher::run_dir_locked(run));  // no lock file
  int holder = ::open(run.lock_file().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(holder >= 0);
  CHECK_FALSE(dtrain::launcher::run_dir_locked(run));  // a file nobody locks
  REQUIRE(::flock(holder, LOCK_EX | LOCK_NB) == 0);    // as a launch holds it
  CHECK(dtrain::launcher::run_dir_locked(run));
  // It follows the lock as another descriptor takes and drops it (read from /proc/locks: the
  // check holds nothing itself, where the old one took LOCK_SH for an instant).
  int other = ::open(run.lock_file().c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(other >= 0);
  REQUIRE(::flock(holder, LOCK_UN) == 0);
  for (int i = 0; i < 200; ++i) {
    CHECK_FALSE(dtrain::launcher::run_dir_locked(run));
    REQUIRE(::flock(other, LOCK_EX | LOCK_NB) == 0);
    CHECK(dtrain::launcher::run_dir_locked(run));
    REQUIRE(::flock(other, LOCK_UN) == 0);
  }
  ::close(other);
  ::close(holder);
}
