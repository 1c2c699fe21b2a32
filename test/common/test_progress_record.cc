// The progress record (docs/design.md#frozen-workers): what the worker writes through its mapping
// is what a reader of the file sees at once, with no flush; a missing, short or foreign file reads
// as no record; an empty path writes nothing.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "common/errors.h"
#include "common/progress_record.h"
#include "test/support/temp_dir.h"

using namespace dtrain;

TEST_CASE("a progress record is read back as written, without a flush") {
  testing::TempDir dir;
  std::string path = dir.path() + "/worker-1.progress";
  CHECK_FALSE(common::read_progress_record(path));
  common::ProgressRecordWriter writer(path);
  std::optional<common::ProgressSample> s = common::read_progress_record(path);
  REQUIRE(s);
  CHECK(s->pid == ::getpid());
  CHECK(s->begun == 0);
  CHECK_FALSE(s->in_collective());

  writer.set_generation(3);
  writer.begin_collective();
  s = common::read_progress_record(path);
  REQUIRE(s);
  CHECK(s->generation == 3);
  CHECK(s->begun == 1);
  CHECK(s->ended == 0);
  CHECK(s->in_collective());  // what a rank blocked in an all-reduce shows

  writer.end_collective();
  writer.finished_step(41, 0.0125);
  s = common::read_progress_record(path);
  REQUIRE(s);
  CHECK_FALSE(s->in_collective());
  CHECK(s->global_step == 41);
  CHECK(s->step_seconds == Approx(0.0125));
}

TEST_CASE("a missing, short or foreign file is no progress record") {
  testing::TempDir dir;
  std::string path = dir.path() + "/other";
  CHECK_FALSE(common::read_progress_record(path));
  std::ofstream(path) << "short";
  CHECK_FALSE(common::read_progress_record(path));
  std::ofstream(path) << std::string(64, 'x');
  CHECK_FALSE(common::read_progress_record(path));
  common::ProgressRecordWriter none("");  // writes nothing, anywhere
  none.begin_collective();
  none.finished_step(1, 1);
  CHECK_THROWS_AS(common::ProgressRecordWriter(dir.path() + "/no/such/dir/record"),
                  common::IoError);
}
