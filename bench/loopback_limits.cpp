// loopback_limits: what one TCP stream over loopback can carry on this machine, next to memcpy,
// in one run: the ceiling tcp.so's 1 MiB writes are measured against (docs/PERFORMANCE.md).
//
// Rows, each for `duration` seconds, 1 MiB blocks walking a 1 GiB source and a 1 GiB
// destination (as transfer_engine_bench does), both pre-faulted, once with 4 KiB pages and once
// with transparent huge pages asked for (MADV_HUGEPAGE, as transfer_engine_bench's buffers by
// default; --huge_pages=false or true runs only that one):
//   memcpy        one thread copying source blocks into destination blocks;
//   tcp copy      a sender thread send()ing source blocks, a receiver thread recv()ing them
//                 into destination blocks over one 127.0.0.1 connection (two kernel copies);
//   tcp zerocopy  the same with SO_ZEROCOPY + MSG_ZEROCOPY sends, completions reaped from the
//                 error queue; counts how many completions the kernel flagged
//                 SO_EE_CODE_ZEROCOPY_COPIED (it copied the pages after all).
// Each row gives GB/s (1e9 B/s) and the CPU time per GiB of each thread (RUSAGE_THREAD), so
// the cost of the kernel's copies can be set against memcpy's in the same run.
//
//   loopback_limits [--duration=SECONDS] [--buffer_size=BYTES] [--block_size=BYTES]
//                   [--huge_pages=both|true|false] [--only=memcpy|tcp|zerocopy] [--json]
#include <time.h>  // before linux/errqueue.h, which uses struct timespec

#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "huge_pages.hpp"

#ifndef SO_EE_ORIGIN_ZEROCOPY
#define SO_EE_ORIGIN_ZEROCOPY 5
#endif
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#ifndef SO_EE_CODE_ZEROCOPY_COPIED
#define SO_EE_CODE_ZEROCOPY_COPIED 1
#endif

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const char *what) {
    std::perror(what);
    std::exit(1);
}

uint8_t *alloc(size_t len, bool huge) {
    std::string error;
    void *p = ferry::map_prefaulted(len, huge, error);
    if (!p) {
        std::fprintf(stderr, "loopback_limits: %s\n", error.c_str());
        std::exit(1);
    }
    std::memset(p, 1, len);
    return static_cast<uint8_t *>(p);
}

const char *arg(int argc, char **argv, const char *name) {
    size_t n = std::strlen(name);
    for (int i = 1; i < argc; ++i)
        if (std::strncmp(argv[i], "--", 2) == 0 && std::strncmp(argv[i] + 2, name, n) == 0 && argv[i][2 + n] == '=')
            return argv[i] + 3 + n;
    return nullptr;
}

double thread_cpu_s() {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct Row {
    std::string name;
    double gbps = 0;
    double a_cpu_per_gib = 0;  // memcpy thread / sender
    double b_cpu_per_gib = 0;  // receiver (tcp rows)
    uint64_t zc_done = 0, zc_copied = 0;
};

struct Bufs {
    uint8_t *src, *dst;
    size_t size, block;
};

Row run_memcpy(const Bufs &b, double duration) {
    Row r{"memcpy"};
    uint64_t bytes = 0;
    size_t off = 0;
    double cpu0 = thread_cpu_s();
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration));
    while (Clock::now() < end) {
        for (int i = 0; i < 16; ++i) {
            std::memcpy(b.dst + off, b.src + off, b.block);
            off = off + 2 * b.block > b.size ? 0 : off + b.block;
            bytes += b.block;
        }
    }
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    r.gbps = bytes / secs / 1e9;
    r.a_cpu_per_gib = (thread_cpu_s() - cpu0) / (bytes / double(1ull << 30));
    return r;
}

void connected_pair(int *client, int *server) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0) die("socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // loopback only, ephemeral port
    socklen_t alen = sizeof a;
    if (bind(l, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || listen(l, 1) != 0 ||
        getsockname(l, reinterpret_cast<sockaddr *>(&a), &alen) != 0)
        die("bind/listen");
    *client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*client < 0 || connect(*client, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) die("connect");
    *server = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    if (*server < 0) die("accept");
    close(l);
    int one = 1;
    setsockopt(*client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Reaps MSG_ZEROCOPY completions; returns how many sends they covered.
uint64_t reap(int fd, Row *r, bool block) {
    uint64_t covered = 0;
    for (;;) {
        char ctrl[128];
        msghdr mh{};
        mh.msg_control = ctrl;
        mh.msg_controllen = sizeof ctrl;
        if (recvmsg(fd, &mh, MSG_ERRQUEUE | (block ? 0 : MSG_DONTWAIT)) < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (!block || covered > 0) return covered;
                usleep(10);  // the error queue raises no poll edge worth waiting for here
                continue;
            }
            die("recvmsg(MSG_ERRQUEUE)");
        }
        for (cmsghdr *c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
            auto *ee = reinterpret_cast<sock_extended_err *>(CMSG_DATA(c));
            if (ee->ee_errno != 0 || ee->ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
            uint64_t n = uint64_t(ee->ee_data) - ee->ee_info + 1;  // [ee_info, ee_data] done
            covered += n;
            r->zc_done += n;
            if (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) r->zc_copied += n;
        }
    }
}

Row run_tcp(const Bufs &b, double duration, bool zerocopy) {
    Row r{zerocopy ? "tcp zerocopy" : "tcp copy"};
    int c, s;
    connected_pair(&c, &s);
    if (zerocopy) {
        int one = 1;
        if (setsockopt(c, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0) die("setsockopt(SO_ZEROCOPY)");
    }
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> received{0};
    double rx_cpu = 0;
    std::thread rx([&] {
        double cpu0 = thread_cpu_s();
        size_t blk = 0, in = 0;  // block being filled, bytes of it received
        uint64_t got = 0;
        for (;;) {
            ssize_t n = recv(s, b.dst + blk + in, b.block - in, 0);
            if (n <= 0) break;
            got += n;
            in += n;
            if (in == b.block) {
                in = 0;
                blk = blk + 2 * b.block > b.size ? 0 : blk + b.block;
            }
        }
        received.store(got, std::memory_order_relaxed);
        rx_cpu = thread_cpu_s() - cpu0;
    });
    double cpu0 = thread_cpu_s();
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration));
    size_t off = 0;
    uint64_t sent = 0, in_flight = 0;
    while (Clock::now() < end) {
        size_t done = 0;
        while (done < b.block) {
            ssize_t n = send(c, b.src + off + done, b.block - done, zerocopy ? MSG_ZEROCOPY : 0);
            if (n < 0) {
                if (zerocopy && errno == ENOBUFS) {  // too many completions outstanding
                    in_flight -= reap(c, &r, true);
                    continue;
                }
                die("send");
            }
            done += n;
            if (zerocopy) ++in_flight;
        }
        sent += b.block;
        off = off + 2 * b.block > b.size ? 0 : off + b.block;
        // A zero-copy source may be rewritten only once its completion came: keep a bound.
        if (zerocopy) in_flight -= reap(c, &r, in_flight > 64);
    }
    shutdown(c, SHUT_WR);
    while (zerocopy && in_flight > 0) in_flight -= reap(c, &r, true);
    rx.join();
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    double tx_cpu = thread_cpu_s() - cpu0;
    uint64_t got = received.load();
    r.gbps = got / secs / 1e9;
    r.a_cpu_per_gib = tx_cpu / (sent / double(1ull << 30));
    r.b_cpu_per_gib = rx_cpu / (got / double(1ull << 30));
    close(c);
    close(s);
    return r;
}

}  // namespace

int main(int argc, char **argv) {
    double duration = 5;
    size_t size = 1ull << 30, block = 1ull << 20;
    if (const char *v = arg(argc, argv, "duration")) duration = std::atof(v);
    if (const char *v = arg(argc, argv, "buffer_size")) size = std::strtoull(v, nullptr, 0);
    if (const char *v = arg(argc, argv, "block_size")) block = std::strtoull(v, nullptr, 0);
    bool json = false;
    for (int i = 1; i < argc; ++i) json |= std::strcmp(argv[i], "--json") == 0;
    if (block == 0 || size < 2 * block) {
        std::fprintf(stderr, "loopback_limits: --buffer_size must hold at least two blocks\n");
        return 2;
    }
    const char *h = arg(argc, argv, "huge_pages");
    const std::string pages = h ? h : "both";
    if (pages != "both" && pages != "true" && pages != "false") {
        std::fprintf(stderr, "loopback_limits: --huge_pages takes both, true or false\n");
        return 2;
    }
    std::vector<Row> rows;
    for (bool huge : {false, true}) {
        if (pages != "both" && (pages == "true") != huge) continue;
        Bufs b{alloc(size, huge), alloc(size, huge), size, block};
        const int64_t thp = ferry::huge_page_bytes(b.src, size) + ferry::huge_page_bytes(b.dst, size);
        const std::string kind = std::string(huge ? ", huge pages asked" : ", huge pages not asked") + " (THP " +
                                 std::to_string(thp >> 20) + " of " + std::to_string(2 * size >> 20) + " MiB)";
        const char *only = arg(argc, argv, "only");
        auto want = [&](const char *row) { return !only || std::strcmp(only, row) == 0; };
        std::vector<Row> these;
        if (want("memcpy")) these.push_back(run_memcpy(b, duration));
        if (want("tcp")) these.push_back(run_tcp(b, duration, false));
        if (want("zerocopy")) these.push_back(run_tcp(b, duration, true));
        for (Row &r : these) {
            r.name += kind;
            rows.push_back(r);
        }
        munmap(b.src, size);
        munmap(b.dst, size);
    }
    if (!json) {
        std::printf("%zu MiB blocks over %zu MiB buffers, %.1f s per row\n", block >> 20, size >> 20, duration);
        std::printf(
            "| what | GB/s | CPU s per GiB: copier/sender | receiver | zero-copy sends done / kernel copied |\n");
        std::printf("|---|---|---|---|---|\n");
    }
    for (const Row &r : rows) {
        if (json)
            std::printf(
                "{\"what\":\"%s\",\"gbps\":%.3f,\"tx_cpu_s_per_gib\":%.4f,\"rx_cpu_s_per_gib\":%.4f,"
                "\"zc_done\":%llu,\"zc_copied\":%llu}\n",
                r.name.c_str(), r.gbps, r.a_cpu_per_gib, r.b_cpu_per_gib, static_cast<unsigned long long>(r.zc_done),
                static_cast<unsigned long long>(r.zc_copied));
        else
            std::printf(
                "| %s | %.2f | %.3f | %s | %s |\n", r.name.c_str(), r.gbps, r.a_cpu_per_gib,
                r.b_cpu_per_gib > 0 ? std::to_string(r.b_cpu_per_gib).substr(0, 5).c_str() : "-",
                r.zc_done > 0 ? (std::to_string(r.zc_done) + " / " + std::to_string(r.zc_copied)).c_str() : "-");
    }
    return 0;
}
