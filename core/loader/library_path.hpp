// Where the dynamic loader would find a library, without loading it: some runtimes (HIP, whose
// LLVM aborts a process that already holds another) must not be dlopen'ed just to look.
#pragma once

#include <optional>
#include <string>

namespace ferry {

// The file dlopen(soname) would load, searched as ld.so(8) does for a name without a slash:
// LD_LIBRARY_PATH, then /etc/ld.so.cache, then the default directories. nullopt: not found.
std::optional<std::string> loader_would_find(const std::string &soname);

}  // namespace ferry
