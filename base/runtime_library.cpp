#include "runtime_library.hpp"

#include <dlfcn.h>

#include <cstdlib>

namespace ferry_base {

RuntimeLibrary open_runtime_library(const char *override_env, std::initializer_list<const char *> sonames) {
    RuntimeLibrary lib;
    auto attempt = [&](const char *name) {
        lib.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (lib.handle) return;
        const char *e = dlerror();
        lib.tried += std::string(lib.tried.empty() ? "" : "; ") + (e ? e : name);
    };
    const char *override_name = std::getenv(override_env);
    lib.overridden = override_name != nullptr && *override_name != '\0';
    if (lib.overridden) attempt(override_name);
    else
        for (const char *name : sonames)
            if (!lib.handle) attempt(name);
    return lib;
}

}  // namespace ferry_base
