// Invariant checks inside fuzz targets: a violated invariant aborts with a message, which
// libFuzzer (and the corpus replay driver) report as a crash with the input that caused it.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, what)                                                                                    \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s (%s)\n", __FILE__, __LINE__, what, #cond); \
            std::abort();                                                                                         \
        }                                                                                                         \
    } while (0)
