// shm.so's serving side (plugins/shm/server.cpp) fed over its real abstract unix socket: each
// input is a Hello and a run of Request records on a fresh connection to a real Transport of
// this process, which copies with process_vm_readv/writev against this process (the initiator
// here) exactly as it would against another one. Two instances: defaults, and adopt_memfd with
// every op split over copy threads (so the memfd checks, pidfd_getfd and the worker path run).
//
// Input: byte 0 picks the instance and the Hello (valid, stale token, unmapped probe, raw
// bytes); then records of a selector byte and 72 bytes read as a Request, whose addresses the
// selector may steer near the registered regions, into this process's local buffer, its
// sealed memfd, an unmapped guard, or leave raw (see steer()). Local addresses are always kept
// inside memory this target owns (a READ writes there), so only the serving side's own checks
// decide what is copied. Every run is one send, so the serving side reads many records at once
// and copies its small ones in vectored groups (plugins/shm/batch.cpp): steer() may make a
// length small and may place a record's ranges right after the previous record's, so groups
// with merged ranges, gate changes and single failing ops within them all occur.
//
// Byte 0's bit 3 (staging, plugins/shm/stage.hpp): the Hello is followed by a StageOffer with
// a sealed memfd (64 KiB) attached, and each record becomes a StageBatch of a block the harness
// writes into that area from the record: 1 to 8 ops whose ranges steer() places, whose slots may
// lie outside their block, or, with selector bit 0x80, a frame (offset, length, count) left raw.
//
// Invariants: no crash, no hang (5 s guard per read); bytes around the registered regions and
// around the local buffers never change; the region registered without REMOTE_WRITE never
// changes; every Request after an accepted Hello gets exactly one Done (a staged batch: one
// with reserved == 0, after one per failed op); the connection is closed by the serving side
// after ours (no descriptor or thread left behind per input).
#include "../../plugins/shm/transport.hpp"
#include "fuzz_check.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

using namespace ferry_shm;

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kLen = 16 * kPage;  // each region and local buffer
constexpr uint8_t kCanary = 0xA5, kReadOnly = 0x3C;

// [guard page][kLen][guard page], guards PROT_NONE: a stray copy faults instead of landing.
struct Guarded {
    uint8_t *base = nullptr, *p = nullptr;
    void init(int memfd = -1) {
        base = static_cast<uint8_t *>(mmap(nullptr, kLen + 2 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        FUZZ_CHECK(base != MAP_FAILED, "mmap");
        p = base + kPage;
        void *at = memfd >= 0 ? mmap(p, kLen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, memfd, 0)
                              : mmap(p, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        FUZZ_CHECK(at == p, "mmap fixed");
    }
    uint64_t addr() const { return reinterpret_cast<uint64_t>(p); }
};

// Plain memory with canary bytes around a region in the middle.
struct Canaried {
    std::vector<uint8_t> all = std::vector<uint8_t>(kLen + 2 * kPage, kCanary);
    uint8_t *p() { return all.data() + kPage; }
    uint64_t addr() { return reinterpret_cast<uint64_t>(p()); }
    bool canaries_intact() const {
        for (size_t i = 0; i < kPage; ++i)
            if (all[i] != kCanary || all[all.size() - 1 - i] != kCanary) return false;
        return true;
    }
};

struct Target {
    Transport *t = nullptr;
    EndpointBytes ep{};
};

Target g_targets[2];
Canaried g_rw, g_ro;       // registered: REMOTE_READ|WRITE, REMOTE_READ only
Canaried g_local;          // the "initiator's" buffer
Guarded g_memfd, g_guard;  // a sealed Ferry memfd mapped here; a PROT_NONE range
int g_memfd_fd = -1;
uint64_t g_memfd_ino = 0;
uint8_t *g_gate_open = nullptr, *g_gate_closed = nullptr;
int g_stage_fd = -1;  // the staging area offered in staging mode, mapped at g_stage
uint8_t *g_stage = nullptr;
constexpr uint64_t kStage = 64 * 1024, kBlock = 4096;
alignas(16) uint64_t g_probe[2] = {0x9e3779b97f4a7c15ull, 0x9e3779b97f4a7c15ull};

// Where the previous record of the input ended (adjacent ranges merge into one iovec).
struct Prev {
    uint64_t remote_end = 0, local_end = 0;
};

Request steer(uint8_t s, Request r, Prev &prev) {
    const uint64_t raw_remote = r.remote_addr, raw_len = r.length, raw_local = r.local_addr;
    switch (s & 3) {
        case 1: r.remote_addr = g_rw.addr() + raw_remote % (kLen + 256) - 128; break;
        case 2: r.remote_addr = g_ro.addr() + raw_remote % (kLen + 256) - 128; break;
        case 3:
            r.remote_addr = (raw_remote >> 63) && prev.remote_end ? prev.remote_end : g_rw.addr() + raw_remote % kLen;
            break;
        default: break;  // raw
    }
    if (s & 4) r.length = (raw_len >> 63) ? raw_len % 257 : raw_len % (kLen + 256);
    if (s & 0x40) r.opcode = (r.opcode & 1) ? FERRY_OP_READ : FERRY_OP_WRITE;
    const bool raw_fd = s & 0x80;
    uint64_t base;
    switch ((s >> 3) & 3) {
        case 2:  // the memfd, described truly (unless the fd stays raw)
            base = g_memfd.addr();
            if (!raw_fd) {
                r.local_fd = g_memfd_fd;
                r.local_ino = g_memfd_ino;
                r.local_base = base;
                r.local_len = kLen;
            }
            break;
        case 3: base = 0; break;  // the guard
        default:
            base = g_local.addr();
            if (!raw_fd) r.local_fd = -1;
            break;
    }
    if (base == 0 || r.length > kLen)
        r.local_addr = g_guard.addr();  // any length: the first page faults, nothing moves
    else if ((raw_local >> 63) && base == g_local.addr() && prev.local_end >= base &&
             prev.local_end - base <= kLen - r.length)
        r.local_addr = prev.local_end;  // right after the previous record's, still inside
    else r.local_addr = base + raw_local % (kLen - r.length + 1);
    prev.remote_end = r.remote_addr + r.length;
    prev.local_end = r.local_addr + r.length;
    r.gate_addr = (s & 0x20) ? reinterpret_cast<uint64_t>(g_gate_closed) : reinterpret_cast<uint64_t>(g_gate_open);
    return r;
}

// Staging mode: record i becomes a StageBatch naming block (i % 16) of the area, written here.
Request stage_record(uint8_t s, const Request &raw, size_t i, Prev &prev) {
    const uint64_t off = (i % (kStage / kBlock)) * kBlock;
    const uint32_t count = 1 + static_cast<uint32_t>(raw.id % 8);
    StageHead h{};
    h.state = (s & 0x20) ? kStageRevoked : kStagePosted;
    h.count = count;
    memcpy(g_stage + off, &h, sizeof h);
    uint64_t data = off + sizeof h + count * sizeof(StageOp);
    for (uint32_t k = 0; k < count; ++k) {
        Request r = raw;
        r.remote_addr += k * 64;
        r.length = (raw.length >> (k * 4)) % 600;
        r = steer(static_cast<uint8_t>(s | 4), r, prev);
        StageOp op{r.remote_addr, data, static_cast<uint32_t>(r.length % 600), r.opcode};
        if ((raw.gate_addr >> k) & 1) op.data_off = raw.local_base + k;  // a slot anywhere (usually outside)
        memcpy(g_stage + off + sizeof h + k * sizeof op, &op, sizeof op);
        data += op.length;
    }
    Request b{};
    b.id = raw.id;
    b.opcode = kOpStageBatch;
    b.local_fd = -1;
    b.remote_addr = (s & 0x80) ? raw.remote_addr : off;
    b.length = (s & 0x80) ? raw.length : kBlock;
    b.local_addr = (s & 0x80) ? raw.local_addr : count;
    return b;
}

int connect_to(const EndpointBytes &ep) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket");
    std::string name = socket_name(ep.pid, ep.token);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, name.data(), name.size());
    int rc;
    do
        rc = connect(fd, reinterpret_cast<sockaddr *>(&sa),
                     static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size()));
    while (rc != 0 && errno == EINTR);
    FUZZ_CHECK(rc == 0, "connect to the shm instance");
    return fd;
}

// Reads exactly len bytes; false at EOF. Aborts after 5 s without progress.
bool read_exact(int fd, void *out, size_t len) {
    auto *p = static_cast<uint8_t *>(out);
    while (len > 0) {
        pollfd pf{fd, POLLIN, 0};
        int r = poll(&pf, 1, 5000);
        if (r < 0 && errno == EINTR) continue;
        FUZZ_CHECK(r > 0, "the serving side did not answer for 5 s");
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

void check_memory() {
    FUZZ_CHECK(g_rw.canaries_intact(), "bytes around the read-write region changed");
    FUZZ_CHECK(g_ro.canaries_intact(), "bytes around the read-only region changed");
    FUZZ_CHECK(g_local.canaries_intact(), "bytes around the initiator's buffer changed");
    for (size_t i = 0; i < kLen; ++i)
        FUZZ_CHECK(g_ro.p()[i] == kReadOnly, "a region registered without REMOTE_WRITE was written");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_guard.init();
    mprotect(g_guard.p, kLen, PROT_NONE);
    g_memfd_fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    FUZZ_CHECK(g_memfd_fd >= 0 && ftruncate(g_memfd_fd, kLen) == 0, "memfd");
    FUZZ_CHECK(fcntl(g_memfd_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0, "seals");
    struct stat st {};
    fstat(g_memfd_fd, &st);
    g_memfd_ino = st.st_ino;
    g_memfd.init(g_memfd_fd);
    auto *gates =
        static_cast<uint8_t *>(mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    FUZZ_CHECK(gates != MAP_FAILED, "gates");
    g_gate_open = gates;
    g_gate_closed = gates + kPage;
    mprotect(g_gate_closed, kPage, PROT_NONE);
    g_stage_fd = memfd_create("fuzz-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    FUZZ_CHECK(g_stage_fd >= 0 && ftruncate(g_stage_fd, kStage) == 0 && posix_fallocate(g_stage_fd, 0, kStage) == 0,
               "stage memfd");
    FUZZ_CHECK(fcntl(g_stage_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0, "stage seals");
    g_stage = static_cast<uint8_t *>(mmap(nullptr, kStage, PROT_READ | PROT_WRITE, MAP_SHARED, g_stage_fd, 0));
    FUZZ_CHECK(g_stage != MAP_FAILED, "stage mmap");
    memset(g_ro.p(), kReadOnly, kLen);
    const ferry_kv_t plain[] = {{"op_timeout_ms", "0"}};
    const ferry_kv_t pieces[] = {{"adopt_memfd", "true"},
                                 {"inline_size", "0"},
                                 {"chunk_size", "4k"},
                                 {"copy_threads", "2"},
                                 {"connect_timeout_ms", "5000"}};
    for (int i = 0; i < 2; ++i) {
        ferry_error_t err{};
        int rc = i == 0 ? Transport::create(plain, 1, nullptr, &g_targets[i].t, &err)
                        : Transport::create(pieces, 5, nullptr, &g_targets[i].t, &err);
        if (rc != 0) fprintf(stderr, "create: %s\n", err.message);
        FUZZ_CHECK(rc == 0, "Transport::create");
        Transport &t = *g_targets[i].t;
        uint64_t h;
        ferry_mem_region_t rw{}, ro{};
        rw.addr = g_rw.addr();
        rw.length = kLen;
        rw.kind = FERRY_MEM_HOST;
        rw.access = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
        ro = rw;
        ro.addr = g_ro.addr();
        ro.access = FERRY_ACCESS_REMOTE_READ;
        FUZZ_CHECK(t.register_mem(&rw, &h, &err) == 0 && t.register_mem(&ro, &h, &err) == 0, "register_mem");
        size_t len = sizeof g_targets[i].ep;
        FUZZ_CHECK(t.export_endpoint(&g_targets[i].ep, &len, &err) == 0, "export_endpoint");
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const Target &target = g_targets[data[0] & 1];
    const int hello_mode = (data[0] >> 1) & 3;
    const bool staging = data[0] & 8;
    size_t at = 1;
    std::string out;
    Hello h{kHelloMagic,
            kWireVersion,
            0,
            target.ep.token,
            reinterpret_cast<uint64_t>(g_probe),
            g_probe[0],
            static_cast<uint32_t>(getpid()),
            static_cast<uint32_t>(getuid())};
    if (hello_mode == 1) h.target_token ^= 1;
    if (hello_mode == 2) h.probe_addr = g_guard.addr();
    if (hello_mode == 3) {  // raw bytes
        size_t n = std::min(size - at, sizeof h);
        memcpy(&h, data + at, n);
        at += n;
    }
    size_t requests = 0;
    Prev prev;
    for (; size - at >= 1 + sizeof(Request); at += 1 + sizeof(Request), ++requests) {
        Request r;
        memcpy(&r, data + at + 1, sizeof r);
        r = staging ? stage_record(data[at], r, requests, prev) : steer(data[at], r, prev);
        out.append(reinterpret_cast<const char *>(&r), sizeof r);
    }
    out.append(reinterpret_cast<const char *>(data + at), size - at);  // a cut record, or nothing

    int fd = connect_to(target.ep);
    FUZZ_CHECK(send(fd, &h, sizeof h, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof h), "send Hello");
    HelloAck ack{};
    bool accepted = read_exact(fd, &ack, sizeof ack) && ack.magic == kAckMagic && ack.status == 0;
    if (accepted && staging) {  // the offer, its descriptor attached; answered first
        Request offer{};
        offer.opcode = kOpStageOffer;
        offer.local_fd = -1;
        offer.length = kStage;
        FUZZ_CHECK(
            send_with_fd(fd, &offer, sizeof offer, g_stage_fd, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof offer),
            "send the offer");
        Done d{};
        FUZZ_CHECK(read_exact(fd, &d, sizeof d) && d.id == 0 && d.message_len == 0, "the offer's answer");
        FUZZ_CHECK(d.status == 0, "a sealed staging memfd was refused");
    }
    for (size_t done = 0; done < out.size();) {
        ssize_t n = send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // refused: the serving side closed
        done += static_cast<size_t>(n);
    }
    FUZZ_CHECK(!accepted || hello_mode != 1, "a stale token was accepted");
    FUZZ_CHECK(!accepted || hello_mode != 2, "a probe at an unmapped address was accepted");
    if (accepted)
        for (size_t i = 0; i < requests;) {
            Done d{};
            FUZZ_CHECK(read_exact(fd, &d, sizeof d), "a request got no answer");
            std::vector<char> message(d.message_len);
            FUZZ_CHECK(read_exact(fd, message.data(), message.size()), "an answer was cut");
            FUZZ_CHECK(d.status <= 0, "an answer with a positive status");
            FUZZ_CHECK(d.reserved == 0 || (staging && d.status < 0), "an op's answer outside a staged batch");
            if (d.reserved == 0) ++i;
        }
    shutdown(fd, SHUT_WR);
    char sink[256];
    while (read_exact(fd, sink, 1)) {}
    close(fd);
    check_memory();
    return 0;
}
