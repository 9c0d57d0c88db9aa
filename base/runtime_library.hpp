// Loading a shared library at run time that a host may lack (libcrypto, hiredis): the one
// named by an override variable when it is set, else the first of a list of sonames. libferry
// and the plugins link these libraries nowhere, so one build runs on hosts without them.
#pragma once

#include <initializer_list>
#include <string>

namespace ferry_base {

struct RuntimeLibrary {
    void *handle = nullptr;   // dlopen'ed RTLD_NOW | RTLD_LOCAL, never closed; null when none loads
    bool overridden = false;  // the override variable named the file (and only it was tried)
    std::string tried;        // each failed dlopen's own message, "; "-separated
};

// $override_env if set and not empty, else each of `sonames` in turn.
RuntimeLibrary open_runtime_library(const char *override_env, std::initializer_list<const char *> sonames);

}  // namespace ferry_base
