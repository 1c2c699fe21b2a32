// Quoting a word for a POSIX shell: what the remote shell and the sbatch script are handed. On its
// own so that the Slurm and remote-shell code need not include each other (docs/design.md#layers).
#pragma once

#include <string>

namespace dtrain::launcher {

/// Single-quoted for a POSIX shell: it's -> 'it'\''s'. Pure.
std::string shell_quote(const std::string& text);

}  // namespace dtrain::launcher
