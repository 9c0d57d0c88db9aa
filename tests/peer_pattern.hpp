// Content the test peer fills its buffer with, and the checksum it reports.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::test {

inline uint8_t peer_pattern(uint64_t i) { return static_cast<uint8_t>((i * 131 + 7) ^ (i >> 11)); }

// Marks test code that reads or writes registered memory which a transport thread also
// accesses, where what orders the two runs through another process (the peer that moved the
// bytes says so over a pipe or socket). ThreadSanitizer cannot see that ordering, so such code
// is not instrumented: otherwise every byte is a race report, and even a suppressed report
// costs a full report per byte (an 8 MiB checksum took over ten minutes).
#define FERRY_TEST_ORDERED_ELSEWHERE __attribute__((no_sanitize("thread")))

FERRY_TEST_ORDERED_ELSEWHERE inline uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

}  // namespace ferry::test
