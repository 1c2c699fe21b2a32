// The agent's stdout framing (agent_protocol.h): worker bytes pass through unchanged but only in
// whole lines (a worker line that starts with the marker byte gets kLineMarker in front, so the
// worker cannot fake the agent's lines), and marker lines go in only where the stream is at the
// start of a line. Pure buffering; writing the bytes out is the caller's (agent.cc).
#pragma once

#include <deque>
#include <string>
#include <string_view>

namespace dtrain::launcher {

class AgentOutput {
 public:
  /// max_line: a worker line longer than this is passed on in pieces (markers wait for its end).
  /// max_queued: marker lines held while mid-line; more are dropped (heartbeats repeat).
  explicit AgentOutput(size_t max_line, size_t max_queued = 256);

  /// Worker output bytes, in order.
  void feed(std::string_view bytes);
  /// One marker line: marker + payload + "\n" (payload without newline).
  void add_marked(std::string_view marker, std::string_view payload);
  /// End of worker output: a partial last line goes out as it is, as the last bytes; markers
  /// still waiting for a line end are dropped, and later ones too.
  void finish();

  /// Bytes ready for stdout; the caller erases what it wrote.
  std::string& ready() { return ready_; }
  size_t ready_size() const { return ready_.size(); }
  size_t dropped() const { return dropped_; }

 private:
  void append_escaped(std::string_view bytes);
  void release_queued();

  size_t max_line_;
  size_t max_queued_;
  std::string ready_;
  std::string partial_;    ///< the worker's unfinished line
  bool mid_line_ = false;  ///< ready_ ends inside a line (an overlong piece)
  bool finished_ = false;
  std::deque<std::string> queued_;
  size_t dropped_ = 0;
};

}  // namespace dtrain::launcher
