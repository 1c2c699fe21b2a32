// See progress_record.h.
#include "common/progress_record.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "common/unique_fd.h"

namespace dtrain::common {

namespace {

template <typename T>
void store(T& field, T value) {
  __atomic_store_n(&field, value, __ATOMIC_RELAXED);
}

template <typename T>
T load(const T& field) {
  return __atomic_load_n(&field, __ATOMIC_RELAXED);
}

}  // namespace

ProgressRecordWriter::ProgressRecordWriter(const std::string& path) {
  if (path.empty()) return;
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  auto fail = [&](const char* what) {
    throw IoError(fmt::format("progress record {}: {}: {}", path, what, std::strerror(errno)));
  };
  if (!fd.valid()) fail("open");
  if (::ftruncate(fd.get(), sizeof(ProgressRecord)) != 0) fail("ftruncate");
  void* at =
      ::mmap(nullptr, sizeof(ProgressRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (at == MAP_FAILED) fail("mmap");
  record_ = static_cast<ProgressRecord*>(at);
  store(record_->version, uint32_t{1});
  store(record_->pid, static_cast<uint32_t>(::getpid()));
  store(record_->magic, kProgressMagic);
}

ProgressRecordWriter::~ProgressRecordWriter() {
  if (record_) ::munmap(record_, sizeof(ProgressRecord));
}

void ProgressRecordWriter::set_generation(int generation) {
  if (record_) store(record_->generation, static_cast<uint32_t>(generation));
}

void ProgressRecordWriter::begin_collective() {
  if (record_) store(record_->begun, load(record_->begun) + 1);
}

void ProgressRecordWriter::end_collective() {
  if (record_) store(record_->ended, load(record_->ended) + 1);
}

void ProgressRecordWriter::finished_step(int64_t global_step, double seconds) {
  if (!record_) return;
  store(record_->global_step, static_cast<uint64_t>(global_step));
  store(record_->step_micros, static_cast<uint64_t>(seconds > 0 ? seconds * 1e6 : 0));
}

void ProgressRecordWriter::set_phase(ProgressPhase phase) {
  if (record_) store(record_->phase, static_cast<uint64_t>(phase));
}

std::optional<ProgressSample> read_progress_record(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return std::nullopt;
  ProgressRecord r{};
  if (::pread(fd.get(), &r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) return std::nullopt;
  if (r.magic != kProgressMagic || r.version != 1) return std::nullopt;
  ProgressSample s;
  s.pid = static_cast<int>(r.pid);
  s.generation = static_cast<int>(r.generation);
  s.begun = r.begun;
  s.ended = r.ended;
  s.global_step = r.global_step;
  s.step_seconds = static_cast<double>(r.step_micros) / 1e6;
  s.phase = progress_phase(r.phase);
  return s;
}

}  // namespace dtrain::common
