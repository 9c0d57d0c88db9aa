#include "huge_pages.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack it
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace ferry {

std::string thp_mode() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    if (!std::getline(f, line)) return "";
    auto a = line.find('['), b = line.find(']');
    return a == std::string::npos || b == std::string::npos || b < a ? "" : line.substr(a + 1, b - a - 1);
}

int advise_huge_pages(void *addr, uint64_t len, bool collapse, std::string &error) {
    const uint64_t begin = (reinterpret_cast<uintptr_t>(addr) + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
    const uint64_t end = (reinterpret_cast<uintptr_t>(addr) + len) & ~(kHugePageBytes - 1);
    if (end <= begin) return 0;
    void *p = reinterpret_cast<void *>(begin);
    if (madvise(p, end - begin, MADV_HUGEPAGE) != 0) {
        int e = errno;
        error = std::string("madvise(MADV_HUGEPAGE): ") + std::strerror(e) +
                (e == EINVAL ? " (a kernel without transparent huge pages, or memory that cannot have them)" : "");
        return -e;
    }
    if (collapse && madvise(p, end - begin, MADV_COLLAPSE) != 0) {
        int e = errno;
        // EAGAIN/ENOMEM: no free huge pages now; EINVAL: a kernel before 6.1. The advice above
        // still holds for pages faulted in later, and khugepaged collapses the rest over time.
        error = std::string("madvise(MADV_COLLAPSE): ") + std::strerror(e) +
                (e == EINVAL ? " (Linux before 6.1: pages already in place stay small until khugepaged merges them)"
                             : " (not enough free huge pages now)");
        return -e;
    }
    return 0;
}

void *map_prefaulted(uint64_t len, bool huge, std::string &error) {
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        error = "mmap of " + std::to_string(len) + " bytes: " + std::strerror(errno);
        return nullptr;
    }
    std::string ignored;  // no THP here: 4 KiB pages, as without `huge`
    if (huge) (void)advise_huge_pages(p, len, false, ignored);
    if (madvise(p, len, MADV_POPULATE_WRITE) != 0) {  // Linux before 5.14: touch every page
        const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
        for (uint64_t off = 0; off < len; off += page) static_cast<volatile uint8_t *>(p)[off] = 0;
    }
    return p;
}

int64_t huge_page_bytes(const void *addr, uint64_t len) {
    std::ifstream f("/proc/self/smaps");
    if (!f) return -1;
    const uint64_t a = reinterpret_cast<uintptr_t>(addr), b = a + len;
    uint64_t lo = 0, hi = 0;
    int64_t total = 0;
    std::string line;
    while (std::getline(f, line)) {
        unsigned long long s = 0, e = 0;
        if (std::sscanf(line.c_str(), "%llx-%llx ", &s, &e) == 2 && line.find(':') > line.find(' ')) {
            lo = s, hi = e;
            continue;
        }
        unsigned long long kb = 0;
        if (std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kb) != 1 &&
            std::sscanf(line.c_str(), "ShmemPmdMapped: %llu kB", &kb) != 1)
            continue;
        const uint64_t o_lo = std::max<uint64_t>(lo, a), o_hi = std::min<uint64_t>(hi, b);
        if (o_hi <= o_lo || hi <= lo) continue;
        total += static_cast<int64_t>(static_cast<long double>(kb) * 1024 * (o_hi - o_lo) / (hi - lo));
    }
    return total;
}

}  // namespace ferry
