// Transparent huge pages for host buffers. Where THP is `madvise` (most distributions' default),
// memory is backed by 4 KiB pages unless someone asks. The kernel's own copies then stop at every
// page and pin page by page (sockets, cross-memory attach), which on an AMD EPYC VM cut tcp.so
// and shm.so over 1 GiB buffers to a third or a half (docs/PERFORMANCE.md, "Host buffers and
// huge pages"). These helpers ask for huge pages on a range and say what the kernel gave.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry {

inline constexpr uint64_t kHugePageBytes = 2ull << 20;

// /sys/kernel/mm/transparent_hugepage/enabled's selected word: "always", "madvise", "never",
// or "" where the file is missing (a kernel without THP).
std::string thp_mode();

// madvise(MADV_HUGEPAGE) on the 2 MiB-aligned part of [addr, addr+len): pages faulted in from now
// on come as huge pages where the kernel has them. With `collapse`, MADV_COLLAPSE too (Linux 6.1+):
// pages already there are merged into huge pages now (a copy of each, so it costs time at once).
// Returns 0, or a negative errno with `error` saying what failed (the range itself is unchanged
// then; its contents never change). A range with no aligned 2 MiB inside it is left alone.
int advise_huge_pages(void *addr, uint64_t len, bool collapse, std::string &error);

// Anonymous private memory of `len` bytes, every page faulted in now (the first pass over it
// then measures no page faults); with `huge`, huge pages asked for before that, since pages
// faulted in small stay small until khugepaged merges them, much later. nullptr with `error`
// set when it cannot be had; free it with munmap.
void *map_prefaulted(uint64_t len, bool huge, std::string &error);

// Bytes of [addr, addr+len) that THP backs now, from /proc/self/smaps (AnonHugePages and
// ShmemPmdMapped of the mappings overlapping the range, prorated to the overlap); -1 when
// smaps cannot be read.
int64_t huge_page_bytes(const void *addr, uint64_t len);

}  // namespace ferry
