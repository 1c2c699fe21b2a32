// See agent_output.h.
#include "launcher/placement/agent_output.h"

#include "launcher/placement/agent_protocol.h"

namespace dtrain::launcher {
namespace {

// Length of the prefix of text that ends with a line terminator, searching only from `from`:
// '\n', or '\r' with a byte after it ('\r' as the last byte may be the start of "\r\n").
size_t whole_lines_length(const std::string& text, size_t from) {
  size_t pos = text.size();
  while (pos > from) {
    size_t at = text.find_last_of("\n\r", pos - 1);
    if (at == std::string::npos || at < from) return 0;
    if (text[at] == '\n' || at + 1 < text.size()) return at + 1;
    pos = at;  // a trailing '\r': look before it
  }
  return 0;
}

}  // namespace

AgentOutput::AgentOutput(size_t max_line, size_t max_queued)
    : max_line_(max_line), max_queued_(max_queued) {}

void AgentOutput::feed(std::string_view bytes) {
  if (bytes.empty()) return;
  // A '\r' that ended the old partial line may be completed by this chunk's first byte.
  size_t from = partial_.empty() ? 0 : partial_.size() - 1;
  partial_.append(bytes);
  if (size_t whole = whole_lines_length(partial_, from); whole > 0) {
    append_escaped(std::string_view(partial_).substr(0, whole));
    partial_.erase(0, whole);
    mid_line_ = false;
    release_queued();
  }
  if (partial_.size() >= max_line_) {
    // A trailing '\r' stays: the next byte tells whether it ends the line.
    size_t piece = partial_.size() - (partial_.back() == '\r' ? 1 : 0);
    append_escaped(std::string_view(partial_).substr(0, piece));
    partial_.erase(0, piece);
    mid_line_ = true;
  }
}

void AgentOutput::add_marked(std::string_view marker, std::string_view payload) {
  if (finished_) {
    ++dropped_;
    return;
  }
  std::string line;
  line.reserve(marker.size() + payload.size() + 1);
  line.append(marker).append(payload).push_back('\n');
  if (!mid_line_) {
    ready_ += line;
  } else if (queued_.size() < max_queued_) {
    queued_.push_back(std::move(line));
  } else {
    ++dropped_;
  }
}

void AgentOutput::finish() {
  bool unterminated = mid_line_ || !partial_.empty();
  append_escaped(partial_);
  partial_.clear();
  if (!unterminated) return;  // at a line start: markers may still follow
  finished_ = true;           // nothing may be glued to the unterminated last line
  dropped_ += queued_.size();
  queued_.clear();
}

// Worker bytes to ready_, with kLineMarker before each line that starts with the marker byte, so
// that only the agent's own lines start with it (agent_protocol.h). A line starts where ready_
// is not mid-line, after '\n', and after a '\r' that no '\n' follows; bytes never ends inside
// "\r\n" (a trailing '\r' is held in partial_ until the next byte).
void AgentOutput::append_escaped(std::string_view bytes) {
  bool line_start = !mid_line_;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (line_start && bytes[i] == kMarkerByte) ready_ += kLineMarker;
    ready_ += bytes[i];
    line_start =
        bytes[i] == '\n' || (bytes[i] == '\r' && i + 1 < bytes.size() && bytes[i + 1] != '\n');
  }
}

void AgentOutput::release_queued() {
  for (const std::string& line : queued_) ready_ += line;
  queued_.clear();
}

}  // namespace dtrain::launcher
