// memcpy_baseline: the single-thread memcpy that shm.so is measured against (bench/shm_vs_memcpy.sh).
//
// Copies `block_size`-byte blocks from one `buffer_size`-byte buffer into another, block after
// block and round and round, for `duration` seconds, the way transfer_engine_bench walks its
// buffer; prints GB/s (1e9 bytes/s). Both buffers are pre-faulted, with transparent huge pages
// asked for (as transfer_engine_bench's are) unless --huge_pages=false.
//
//   memcpy_baseline [--buffer_size=BYTES] [--block_size=BYTES] [--duration=SECONDS]
//                   [--huge_pages=true|false] [--json]
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "huge_pages.hpp"

namespace {

uint8_t *alloc(size_t len, bool huge) {
    std::string error;
    void *p = ferry::map_prefaulted(len, huge, error);
    if (!p) {
        fprintf(stderr, "memcpy_baseline: %s\n", error.c_str());
        exit(1);
    }
    memset(p, 1, len);
    return static_cast<uint8_t *>(p);
}

const char *arg(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; ++i)
        if (strncmp(argv[i], "--", 2) == 0 && strncmp(argv[i] + 2, name, n) == 0 && argv[i][2 + n] == '=')
            return argv[i] + 3 + n;
    return nullptr;
}

bool flag(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; ++i)
        if (strncmp(argv[i], "--", 2) == 0 && strcmp(argv[i] + 2, name) == 0) return true;
    return false;
}

}  // namespace

int main(int argc, char **argv) {
    const char *b = arg(argc, argv, "buffer_size"), *k = arg(argc, argv, "block_size"),
               *d = arg(argc, argv, "duration");
    const size_t buffer = b ? strtoull(b, nullptr, 0) : 1ull << 30;
    const size_t block = k ? strtoull(k, nullptr, 0) : 1ull << 20;
    const double seconds = d ? strtod(d, nullptr) : 5.0;
    if (block == 0 || block > buffer || seconds <= 0) {
        fprintf(stderr, "memcpy_baseline: need 0 < block_size <= buffer_size and duration > 0\n");
        return 2;
    }
    const char *h = arg(argc, argv, "huge_pages");
    const bool huge = !h || strcmp(h, "false") != 0;
    uint8_t *src = alloc(buffer, huge), *dst = alloc(buffer, huge);
    const size_t blocks = buffer / block;
    for (size_t i = 0; i < blocks; ++i)  // one warm pass
        memcpy(dst + i * block, src + i * block, block);
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    uint64_t copies = 0;
    for (size_t i = 0; Clock::now() < end; i = (i + 1) % blocks, ++copies)
        memcpy(dst + i * block, src + i * block, block);
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    const double gbps = static_cast<double>(copies) * block / secs / 1e9;
    if (flag(argc, argv, "json"))
        printf(
            "{\"block_size\":%zu,\"buffer_size\":%zu,\"duration_s\":%.3f,\"bytes\":%.0f,\"throughput\":%.2f,"
            "\"unit\":\"GB/s\",\"huge_page_bytes\":%lld}\n",
            block, buffer, secs, static_cast<double>(copies) * block, gbps,
            static_cast<long long>(ferry::huge_page_bytes(src, buffer) + ferry::huge_page_bytes(dst, buffer)));
    else
        printf(
            "memcpy %zu-byte blocks over %zu bytes, 1 thread: %.2f GB/s (huge pages: %lld MiB of %zu)\n", block, buffer,
            gbps,
            static_cast<long long>((ferry::huge_page_bytes(src, buffer) + ferry::huge_page_bytes(dst, buffer)) >> 20),
            2 * buffer >> 20);
    return 0;
}
