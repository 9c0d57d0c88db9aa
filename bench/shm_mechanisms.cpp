// shm_mechanisms: the measurement behind shm.so's design choice (docs/DESIGN.md, "shm.so").
//
// A child process owns a plain anonymous buffer and a memfd-backed buffer. This process moves
// `block`-byte blocks over a `buffer`-byte span with, one after another:
//   memcpy           local -> local (the single-thread memcpy baseline)
//   process_vm_writev / process_vm_readv   this process <-> the child's anonymous buffer
//   memfd mapped     memcpy into / out of the child's memfd, mapped here (MAP_SHARED)
//   memfd bounce     memcpy into a shared staging memfd, then memcpy out of it (two copies: what
//                    a memfd design costs for memory the application did not allocate from it)
// and prints GB/s (1e9 bytes/s) for each.
//
//   shm_mechanisms [--buffer_size=BYTES] [--block_size=BYTES] [--duration=SECONDS]
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

uint8_t *map_anon(size_t len) {
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return static_cast<uint8_t *>(p);
}

uint8_t *map_fd(int fd, size_t len) {
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap memfd");
        exit(1);
    }
    return static_cast<uint8_t *>(p);
}

int make_memfd(const char *name, size_t len) {
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(len)) != 0) {
        perror("memfd");
        exit(1);
    }
    return fd;
}

// Runs fn(offset) over consecutive blocks for `seconds`, returns GB/s.
double rate(size_t buffer, size_t block, double seconds, const std::function<void(size_t)> &fn) {
    const size_t blocks = buffer / block;
    for (size_t i = 0; i < blocks; ++i) fn(i * block);  // one warm pass
    size_t done = 0;
    auto start = Clock::now();
    auto end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (Clock::now() < end)
        for (size_t i = 0; i < blocks && (i & 15 || Clock::now() < end); ++i, ++done) fn(i * block);
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(done) * block / secs / 1e9;
}

size_t arg(int argc, char **argv, const char *name, size_t def) {
    std::string prefix = std::string("--") + name + "=";
    for (int i = 1; i < argc; ++i)
        if (strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return strtoull(argv[i] + prefix.size(), nullptr, 0);
    return def;
}

}  // namespace

int main(int argc, char **argv) {
    const size_t buffer = arg(argc, argv, "buffer_size", 1ull << 30);
    const size_t block = arg(argc, argv, "block_size", 1ull << 20);
    const double seconds = static_cast<double>(arg(argc, argv, "duration", 3));
    if (block == 0 || block > buffer) {
        fprintf(stderr, "block_size must be in (0, buffer_size]\n");
        return 2;
    }
    int region_fd = make_memfd("ferry-bench-region", buffer);
    int staging_fd = make_memfd("ferry-bench-staging", buffer);
    uint8_t *child_anon = map_anon(buffer);  // the child's copy-on-write twin: same address there
    memset(child_anon, 1, buffer);
    int ready[2], quit[2];
    if (pipe(ready) != 0 || pipe(quit) != 0) return 1;
    pid_t child = fork();
    if (child == 0) {
        memset(child_anon, 2, buffer);  // break COW: the child's own pages
        uint8_t *mapped = map_fd(region_fd, buffer);
        memset(mapped, 3, buffer);
        char c = 'r';
        if (write(ready[1], &c, 1) != 1) _exit(1);
        (void)!read(quit[0], &c, 1);
        _exit(0);
    }
    char c;
    if (read(ready[0], &c, 1) != 1) return 1;
    uint8_t *src = map_anon(buffer), *dst = map_anon(buffer);
    memset(src, 4, buffer);
    memset(dst, 5, buffer);
    uint8_t *region = map_fd(region_fd, buffer);    // the child's memfd region, mapped here
    uint8_t *staging = map_fd(staging_fd, buffer);  // a shared bounce buffer

    auto pvm = [&](bool write_remote, size_t off) {
        iovec l{src + off, block}, r{child_anon + off, block};
        ssize_t n = write_remote ? process_vm_writev(child, &l, 1, &r, 1, 0) : process_vm_readv(child, &l, 1, &r, 1, 0);
        if (n != static_cast<ssize_t>(block)) {
            perror("process_vm");
            exit(1);
        }
    };
    printf("block %zu bytes over a %zu-byte buffer, %.0f s per row, GB/s = 1e9 bytes/s\n", block, buffer, seconds);
    printf("%-34s %6.2f\n", "memcpy local->local (1 thread)",
           rate(buffer, block, seconds, [&](size_t o) { memcpy(dst + o, src + o, block); }));
    printf("%-34s %6.2f\n", "process_vm_writev -> child",
           rate(buffer, block, seconds, [&](size_t o) { pvm(true, o); }));
    printf("%-34s %6.2f\n", "process_vm_readv <- child",
           rate(buffer, block, seconds, [&](size_t o) { pvm(false, o); }));
    printf("%-34s %6.2f\n", "memfd mapped, memcpy -> child",
           rate(buffer, block, seconds, [&](size_t o) { memcpy(region + o, src + o, block); }));
    printf("%-34s %6.2f\n", "memfd mapped, memcpy <- child",
           rate(buffer, block, seconds, [&](size_t o) { memcpy(dst + o, region + o, block); }));
    printf("%-34s %6.2f\n", "memfd bounce (2 copies)", rate(buffer, block, seconds, [&](size_t o) {
               memcpy(staging + o, src + o, block);
               memcpy(dst + o, staging + o, block);
           }));
    if (write(quit[1], "q", 1) != 1) return 1;
    waitpid(child, nullptr, 0);
    return 0;
}
