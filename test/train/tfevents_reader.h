// Runs test/train/read_tfevents.py, the event-file reader written from the TFRecord and
// protobuf specifications (not from dtrain's writer), and turns its JSON into scalars, checking
// on the way that every value is a TF2 scalar: a rank-0 DT_FLOAT tensor of the scalars plugin.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "test/support/subprocess.h"

namespace dtrain::testing {

struct Scalar {
  std::string tag;
  int64_t step = 0;
  double value = 0;
};

struct EventFile {
  std::string name;
  std::string file_version;        ///< of the first event
  std::vector<Scalar> scalars;     ///< every value of the later events, in order
  std::vector<double> wall_times;  ///< of the later events
};

/// tag -> step -> value.
using ScalarsByTag = std::map<std::string, std::map<int64_t, double>>;

/// The reader on an event file or a folder of them (exit 1 and a message on stderr when a CRC,
/// a length or a protobuf is bad).
ProcessResult run_tfevents_reader(const std::string& path);
/// The files the reader found under path, in name order; a Catch2 failure if it failed.
std::vector<EventFile> read_events(const std::string& path);
/// Every file's scalars by tag and step; a tag written twice at one step is a Catch2 failure.
ScalarsByTag by_tag(const std::vector<EventFile>& files);
std::set<std::string> tags(const ScalarsByTag& scalars);

}  // namespace dtrain::testing
