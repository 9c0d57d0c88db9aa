// shm.so's batched path for small ops (plugins/shm/batch.cpp): the requests of one read copied
// by few vectored syscalls. Mixed batches to two peer processes land byte-exact; one bad op in a
// batch of 128 fails alone with its own error; forged runs of requests over a raw socket (more
// than IOV_MAX of them, overlapping, wrapping, naming a closed gate) are each answered once and
// move nothing they should not; small READs that timed out never get bytes afterwards.
#include "../../plugins/shm/wire.hpp"
#include "harness.hpp"
#include "peer_process.hpp"
#include "shm_test_util.hpp"

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#ifdef FERRY_TEST_SHM_PLUGIN

namespace ferry_test {
namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr uint64_t kKiB = 1024, kMiB = 1ull << 20;

class ShmBatchTest : public ShmPluginTest {};

// 256 ops to each of two peer processes, submitted back to back: WRITEs packed (adjacent on
// both sides), READs packed, then alternating READ/WRITE scattered over 16 local regions, with
// lengths from 1 to 300 bytes.
TEST_F(ShmBatchTest, MixedBatchesToTwoPeersLandByteExact) {
    auto a = make();
    ASSERT_TRUE(a);
    constexpr int kRegions = 16, kOps = 256;
    constexpr uint64_t kRegion = 64 * kKiB, kPeer = kMiB;
    std::vector<std::unique_ptr<Buffer>> locals;
    std::vector<uint64_t> handles(kRegions);
    std::vector<std::unique_ptr<ChildPeer>> children;
    std::vector<uint64_t> peers(2), rmems(2);
    for (int c = 0; c < 2; ++c) {
        children.push_back(std::make_unique<ChildPeer>(shm_path(), kPeer, kRW, Options{}));
        ASSERT_TRUE(children[c]->ok()) << children[c]->error();
        ASSERT_TRUE(children[c]->fill(0, kPeer, 70 + c));
        ASSERT_EQ(a->connect(children[c]->endpoint(), &peers[c]), 0) << a->last_error();
        ASSERT_EQ(a->import_mem(peers[c], children[c]->addr(), kPeer, kRW, &rmems[c]), 0);
    }
    struct Planned {
        uint32_t opcode;
        int region;
        uint64_t local_off, remote_off, len;
    };
    std::vector<Planned> plan;
    uint64_t packed_local = 0, packed_remote = 0;
    for (int k = 0; k < kOps; ++k) {
        const uint64_t len = 1 + (static_cast<uint64_t>(k) * 37) % 300;
        if (k < 128) {  // 0..63 WRITE from region 0, 64..127 READ into region 1, both packed
            if (k == 64) packed_local = 0;
            plan.push_back({k < 64 ? FERRY_OP_WRITE : FERRY_OP_READ, k < 64 ? 0 : 1, packed_local, packed_remote, len});
            packed_local += len;
            packed_remote += len;
        } else {
            plan.push_back({k % 2 ? FERRY_OP_READ : FERRY_OP_WRITE, 2 + k % (kRegions - 2),
                            static_cast<uint64_t>(k / (kRegions - 2)) * 512, 512 * kKiB + k * 1024ull, len});
        }
    }
    for (int r = 0; r < kRegions; ++r) {
        locals.push_back(std::make_unique<Buffer>(kRegion));
        ASSERT_EQ(a->register_mem(locals[r]->data(), kRegion, 0, &handles[r]), 0);
    }
    // Both peers' ops follow the plan; the second peer's use the upper half of each local region.
    for (int r = 0; r < kRegions; ++r) fill_pattern(locals[r]->data(), kRegion, 100 + r);
    for (int c = 0; c < 2; ++c) {
        std::vector<ferry_xfer_op_t> ops;
        for (int k = 0; k < kOps; ++k) {
            const Planned &p = plan[k];
            ops.push_back(make_op(p.opcode, locals[p.region]->addr() + c * (kRegion / 2) + p.local_off,
                                  handles[p.region], children[c]->addr() + p.remote_off, rmems[c], p.len,
                                  c * kOps + k));
        }
        ASSERT_EQ(a->submit(peers[c], ops), 0) << a->last_error();
    }
    auto done = a->wait(2 * kOps);
    ASSERT_EQ(done.size(), 2u * kOps);
    for (const auto &x : done) EXPECT_EQ(x.status, 0) << "op " << x.user_data << ": " << x.message;
    for (int c = 0; c < 2; ++c) {
        std::vector<uint8_t> expect(kPeer);
        fill_pattern(expect.data(), kPeer, 70 + c);
        for (int k = 0; k < kOps; ++k) {
            const Planned &p = plan[k];
            const uint8_t *mine = locals[p.region]->data() + c * (kRegion / 2) + p.local_off;
            if (p.opcode == FERRY_OP_WRITE) {
                std::vector<uint8_t> src(p.len);
                fill_pattern(src.data(), p.len, 100 + p.region, c * (kRegion / 2) + p.local_off);
                memcpy(expect.data() + p.remote_off, src.data(), p.len);
            } else {
                EXPECT_EQ(find_mismatch(mine, p.len, 70 + c, p.remote_off), SIZE_MAX) << "peer " << c << " READ " << k;
            }
        }
        uint64_t h = 0;
        ASSERT_TRUE(children[c]->hash(0, kPeer, &h));
        EXPECT_EQ(h, fnv1a(expect.data(), kPeer)) << "peer " << c << "'s memory after the WRITEs";
    }
    for (auto &c : children) EXPECT_TRUE(c->exit_cleanly());
}

// 128 adjacent 64-byte ops, one of them bad in one way per round: outside the serving side's
// registered memory (-EFAULT), a WRITE to a region registered read-only there (-EACCES), or a
// local buffer the kernel cannot touch in the middle of the merged range (-EFAULT from the
// vectored copy, READ and WRITE). Only that op fails; the 127 others land.
TEST_F(ShmBatchTest, OneBadOpInABatchOf128FailsAloneWithItsOwnError) {
    auto a = make();
    auto b = make();
    ASSERT_TRUE(a && b);
    Buffer tgt(2 * kMiB), ro(64 * kKiB), loc(kMiB);
    uint64_t ht, hro, hl, peer, rmem, rro;
    ASSERT_EQ(b->register_mem(tgt.data(), kMiB, kRW, &ht), 0);  // the second MiB is not registered
    ASSERT_EQ(b->register_mem(ro.data(), ro.size(), FERRY_ACCESS_REMOTE_READ, &hro), 0);
    ASSERT_EQ(a->register_mem(loc.data(), loc.size(), 0, &hl), 0);
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, tgt.addr(), 2 * kMiB, kRW, &rmem), 0);  // wider than registered
    ASSERT_EQ(a->import_mem(peer, ro.addr(), ro.size(), kRW, &rro), 0);
    const uint64_t guard_off = 512 * kKiB;  // a PROT_NONE page inside the registered local region
    struct Round {
        uint32_t opcode;
        size_t bad;
        int expect;
        const char *what;
    };
    for (const Round &round : {Round{FERRY_OP_READ, 57, -EFAULT, "remote outside registered memory"},
                               Round{FERRY_OP_WRITE, 90, -EACCES, "WRITE to a read-only region"},
                               Round{FERRY_OP_READ, 33, -EFAULT, "READ into an inaccessible local page"},
                               Round{FERRY_OP_WRITE, 100, -EFAULT, "WRITE from an inaccessible local page"}}) {
        SCOPED_TRACE(round.what);
        fill_pattern(tgt.data(), kMiB, 5);
        fill_pattern(loc.data(), guard_off, 6);
        std::vector<ferry_xfer_op_t> ops;
        for (size_t i = 0; i < 128; ++i)
            ops.push_back(make_op(round.opcode, loc.addr() + i * 64, hl, tgt.addr() + i * 64, rmem, 64, i));
        auto &bad = ops[round.bad];
        if (round.expect == -EACCES) {
            bad.remote_addr = ro.addr();
            bad.remote_mem = rro;
        } else if (std::string(round.what).find("local") != std::string::npos) {
            bad.local_addr = loc.addr() + guard_off;
        } else {
            bad.remote_addr = tgt.addr() + kMiB + 4096;
        }
        ASSERT_EQ(mprotect(loc.data() + guard_off, 4096, PROT_NONE), 0);
        ASSERT_EQ(a->submit(peer, ops), 0) << a->last_error();
        auto c = a->wait(128);
        ASSERT_EQ(mprotect(loc.data() + guard_off, 4096, PROT_READ | PROT_WRITE), 0);
        ASSERT_EQ(c.size(), 128u);
        for (const auto &x : c) {
            if (x.user_data == round.bad) {
                EXPECT_EQ(x.status, round.expect) << x.message;
                EXPECT_NE(std::string(x.message).find("shm: pid"), std::string::npos) << x.message;
            } else {
                EXPECT_EQ(x.status, 0) << "op " << x.user_data << ": " << x.message;
            }
        }
        for (size_t i = 0; i < 128; ++i) {
            if (i == round.bad) continue;
            if (round.opcode == FERRY_OP_READ)
                EXPECT_EQ(find_mismatch(loc.data() + i * 64, 64, 5, i * 64), SIZE_MAX) << "op " << i;
            else EXPECT_EQ(find_mismatch(tgt.data() + i * 64, 64, 6, i * 64), SIZE_MAX) << "op " << i;
        }
        if (round.opcode == FERRY_OP_READ && round.bad == 57) {  // the failed READ's own bytes stay
            EXPECT_EQ(find_mismatch(loc.data() + 57 * 64, 64, 6, 57 * 64), SIZE_MAX);
        }
        if (round.opcode == FERRY_OP_WRITE && round.bad == 100) {
            EXPECT_EQ(find_mismatch(tgt.data() + 100 * 64, 64, 5, 100 * 64), SIZE_MAX);
        }
    }
}

// A hand-written initiator on a raw socket: Hello (with a real probe), then 3000 forged Request
// records in one send, more than one read (64 KiB) and than IOV_MAX. Every record is answered
// exactly once with the status its kind calls for, nothing lands outside the registered regions
// or in the read-only one, nothing lands for ops naming a closed gate, and a record cut by the
// close does not disturb the serving side, which keeps serving.
TEST_F(ShmBatchTest, ForgedRequestRunsAreAnsweredOneByOneAndMoveNothingElse) {
    using namespace ferry_shm;
    auto b = make();
    ASSERT_TRUE(b);
    constexpr uint64_t kLen = 256 * kKiB, kPage = 4096;
    Buffer rw_all(kLen + 2 * kPage), ro_all(kLen + 2 * kPage), mine(kLen), gates(2 * kPage);
    uint8_t *rw = rw_all.data() + kPage, *ro = ro_all.data() + kPage;
    memset(rw_all.data(), 0xA5, rw_all.size());
    memset(ro_all.data(), 0x3C, ro_all.size());
    fill_pattern(mine.data(), kLen, 8);
    uint64_t h;
    ASSERT_EQ(b->register_mem(rw, kLen, kRW, &h), 0);
    ASSERT_EQ(b->register_mem(ro, kLen, FERRY_ACCESS_REMOTE_READ, &h), 0);
    ASSERT_EQ(mprotect(gates.data() + kPage, kPage, PROT_NONE), 0);  // a revoked gate
    const uint64_t open_gate = gates.addr(), closed_gate = gates.addr() + kPage;
    alignas(16) static uint64_t probe[2] = {0x1234567887654321ull, 0x1234567887654321ull};
    RawShmClient raw = raw_shm_client(b->endpoint(), probe);
    ASSERT_GE(raw.fd, 0);
    const int fd = raw.fd;
    const Hello &hello = raw.hello;
    std::string out(reinterpret_cast<const char *>(&hello), sizeof hello);
    enum Kind { kGood, kOverlap, kRemoteWraps, kLocalWraps, kHuge, kZero, kBadOpcode, kReadOnly, kClosedGate, kKinds };
    constexpr size_t kCount = 3000;
    std::map<uint64_t, int> expect;
    for (size_t i = 0; i < kCount; ++i) {
        const Kind kind = static_cast<Kind>((i * 7) % kKinds);
        Request r{};
        r.id = 1000 + i;
        r.opcode = i % 2 ? FERRY_OP_READ : FERRY_OP_WRITE;
        r.local_fd = -1;
        r.length = 64;
        r.remote_addr = reinterpret_cast<uint64_t>(rw) + (i * 64) % (kLen - 64);
        r.local_addr = mine.addr() + (i * 64) % (kLen - 64);
        r.gate_addr = open_gate;
        int status = 0;
        switch (kind) {
            case kGood: break;
            case kOverlap:  // the same bytes as several other ops, on both sides
                r.remote_addr = reinterpret_cast<uint64_t>(rw) + 32;
                r.local_addr = mine.addr() + 16;
                r.length = 100;
                break;
            case kRemoteWraps:
                r.length = UINT64_MAX - 50;
                status = -EFAULT;
                break;
            case kLocalWraps:
                r.local_addr = UINT64_MAX - 10;
                status = -EFAULT;
                break;
            case kHuge:  // more than any region: refused before any copy
                r.length = 1ull << 40;
                status = -EFAULT;
                break;
            case kZero:
                r.length = 0;
                status = -EINVAL;
                break;
            case kBadOpcode:
                r.opcode = 77;
                status = -EINVAL;
                break;
            case kReadOnly:
                r.opcode = FERRY_OP_WRITE;
                r.remote_addr = reinterpret_cast<uint64_t>(ro) + (i * 64) % (kLen - 64);
                status = -EACCES;
                break;
            case kClosedGate:
                r.gate_addr = closed_gate;
                status = -ECANCELED;
                break;
            default: break;
        }
        if (kind == kClosedGate || kind == kReadOnly) r.local_addr = mine.addr();
        expect[r.id] = status;
        out.append(reinterpret_cast<const char *>(&r), sizeof r);
    }
    // READs naming the closed gate write into mine.addr(): that must never happen.
    std::vector<uint8_t> mine_first(64);
    memcpy(mine_first.data(), mine.data(), 64);
    Request cut{};
    out.append(reinterpret_cast<const char *>(&cut), sizeof cut / 2);
    std::thread writer([&] {
        for (size_t at = 0; at < out.size();) {
            ssize_t n = send(fd, out.data() + at, out.size() - at, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            at += static_cast<size_t>(n);
        }
    });
    auto read_exact = [&](void *p, size_t len) {
        auto *q = static_cast<uint8_t *>(p);
        while (len > 0) {
            pollfd pf{fd, POLLIN, 0};
            if (poll(&pf, 1, 30000) <= 0) return false;
            ssize_t n = recv(fd, q, len, 0);
            if (n <= 0) return false;
            q += n;
            len -= static_cast<size_t>(n);
        }
        return true;
    };
    HelloAck ack{};
    ASSERT_TRUE(read_exact(&ack, sizeof ack));
    ASSERT_EQ(ack.status, 0) << ack.message;
    std::map<uint64_t, int> got;
    for (size_t i = 0; i < kCount; ++i) {
        Done d{};
        ASSERT_TRUE(read_exact(&d, sizeof d)) << "answer " << i << " of " << kCount << " missing";
        std::string message(d.message_len, '\0');
        ASSERT_TRUE(read_exact(message.data(), message.size()));
        EXPECT_TRUE(got.emplace(d.id, d.status).second) << "two answers for request " << d.id;
        EXPECT_EQ(d.status == 0, message.empty()) << message;
    }
    writer.join();
    shutdown(fd, SHUT_WR);  // the cut record is never completed
    char sink;
    EXPECT_TRUE(!read_exact(&sink, 1)) << "bytes after the last answer";
    close(fd);
    size_t mismatched = 0;
    for (auto &[id, st] : expect)
        if (got.count(id) == 0 || got[id] != st) {
            if (++mismatched <= 5)
                ADD_FAILURE() << "request " << id << " (kind " << ((id - 1000) * 7) % kKinds << "): status "
                              << (got.count(id) ? got[id] : 1) << ", expected " << st;
        }
    EXPECT_EQ(mismatched, 0u);
    for (size_t i = 0; i < kPage; ++i) {
        ASSERT_EQ(rw_all.data()[i], 0xA5) << "written before the read-write region";
        ASSERT_EQ(rw_all.data()[kPage + kLen + i], 0xA5) << "written after the read-write region";
    }
    for (size_t i = 0; i < ro_all.size(); ++i) ASSERT_EQ(ro_all.data()[i], 0x3C) << "the read-only region changed";
    // The serving side still serves a well-behaved initiator.
    auto a = make();
    ASSERT_TRUE(a);
    uint64_t hl, peer, rmem;
    ASSERT_EQ(a->register_mem(mine.data(), kLen, 0, &hl), 0);
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, reinterpret_cast<uint64_t>(rw), kLen, kRW, &rmem), 0);
    fill_pattern(mine.data(), kLen, 9);
    ASSERT_EQ(
        a->submit(peer, {make_op(FERRY_OP_WRITE, mine.addr(), hl, reinterpret_cast<uint64_t>(rw), rmem, kLen, 1)}), 0);
    auto c = a->wait(1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, 0) << c[0].message;
    EXPECT_EQ(find_mismatch(rw, kLen, 9), SIZE_MAX);
}

// The gate for small ops: the serving process is stopped with 128 64-byte READs queued; they
// time out, and when it resumes and copies them in one batch, not one byte lands.
TEST_F(ShmBatchTest, SmallReadsThatTimedOutNeverGetBytesAfterwards) {
    auto a = make({{"op_timeout_ms", "1000"}});
    ASSERT_TRUE(a);
    ChildPeer child(shm_path(), kMiB, kRW, {});
    ASSERT_TRUE(child.ok()) << child.error();
    ASSERT_TRUE(child.fill(0, kMiB, 41));
    Buffer loc(64 * kKiB), probe(4096);
    memset(loc.data(), 0xEE, loc.size());
    uint64_t hl, hp, peer, rmem;
    ASSERT_EQ(a->register_mem(loc.data(), loc.size(), 0, &hl), 0);
    ASSERT_EQ(a->register_mem(probe.data(), probe.size(), 0, &hp), 0);
    ASSERT_EQ(a->connect(child.endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, child.addr(), kMiB, kRW, &rmem), 0);
    std::vector<ferry_xfer_op_t> ops;
    for (size_t i = 0; i < 128; ++i)
        ops.push_back(make_op(FERRY_OP_READ, loc.addr() + i * 64, hl, child.addr() + i * 64, rmem, 64, i));
    child.stop();
    ASSERT_EQ(a->submit(peer, ops), 0) << a->last_error();
    auto c = a->wait(128, std::chrono::seconds(30));
    ASSERT_EQ(c.size(), 128u) << "ops still pending 30 s after op_timeout_ms=1000";
    for (const auto &x : c) EXPECT_EQ(x.status, -ETIMEDOUT) << x.message;
    child.resume();
    // Behind the old requests on the same connection: once it is answered, they were copied or refused.
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, probe.addr(), hp, child.addr(), rmem, 64, 1000)}), 0);
    auto p = a->wait(1, std::chrono::seconds(30));
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].status, 0) << p[0].message;
    EXPECT_EQ(find_mismatch(probe.data(), 64, 41), SIZE_MAX);
    size_t landed = 0;
    for (size_t i = 0; i < loc.size(); ++i) landed += loc.data()[i] != 0xEE;
    EXPECT_EQ(landed, 0u) << "bytes landed in READ buffers after their ops timed out";
}

}  // namespace
}  // namespace ferry_test

#endif  // FERRY_TEST_SHM_PLUGIN
