// Decompressed copies of gzip IDX files, so that a restarted worker skips the inflate (about
// 0.2 s of Fashion-MNIST's training images on these machines, most of a restart's data load).
// A copy is named by the source's device, inode, size and modification time, so a changed
// source is never served stale; it is written atomically, and a copy that fails the IDX checks
// is thrown away and made again. Best effort: a cache that cannot be written is skipped.
#pragma once

#include <optional>
#include <string>

namespace dtrain::data {

/// Where copies go: $DTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/dtrain, else $HOME/.cache/dtrain;
/// nullopt when DTRAIN_CACHE_DIR is "off" or no folder can be named.
std::optional<std::string> idx_cache_dir();

/// The cache file for the gzip file at path (under dir), or nullopt when path cannot be stat'ed.
std::optional<std::string> idx_cache_path(const std::string& dir, const std::string& path);

/// Writes bytes (path's decompressed contents) to its cache file; false when it could not.
bool store_idx_cache(const std::string& cache_file, const std::string& bytes);

}  // namespace dtrain::data
