// Checks that a buffer holds one byte value, for fuzz targets that scan canaries and regions
// on every input. Word by word and without coverage or ASan instrumentation: over 1.3 MiB per
// input a traced byte loop cost 10 ms and capped tcp_conn_fuzz at 30 inputs/s.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__clang__)
__attribute__((no_sanitize("coverage", "address")))
#endif
inline bool
all_bytes(const uint8_t *p, size_t n, uint8_t v) {
    const uint64_t word = 0x0101010101010101ull * v;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w != word) return false;
    }
    for (; i < n; ++i)
        if (p[i] != v) return false;
    return true;
}
