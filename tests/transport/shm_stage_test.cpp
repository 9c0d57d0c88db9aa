// shm.so's staging area for small ops (plugins/shm/stage.hpp). A forged initiator over a raw
// socket offers descriptors that must be refused (none, a pipe, an unsealed memfd, a wrong
// size, a second area) and then forged blocks (outside the area, too many ops, bytes outside
// their block, ranges outside registered memory or without the right, a revoked block): each is
// answered and nothing outside the registered regions and the blocks' own slots changes.
// Batches of small ops from several threads to one peer process land byte-exact; a peer killed
// with batches of small ops in flight fails them (and only them) in time.
#include "../../plugins/shm/stage.hpp"
#include "../../plugins/shm/wire.hpp"
#include "harness.hpp"
#include "peer_process.hpp"
#include "shm_test_util.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#ifdef FERRY_TEST_SHM_PLUGIN

namespace ferry_test {
namespace {

using namespace ferry_shm;

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr uint64_t kKiB = 1024, kMiB = 1ull << 20;

class ShmStageTest : public ShmPluginTest {};

bool read_exact(int fd, void *out, size_t len) {
    auto *p = static_cast<uint8_t *>(out);
    while (len > 0) {
        pollfd pf{fd, POLLIN, 0};
        if (poll(&pf, 1, 10000) <= 0) return false;
        ssize_t n = recv(fd, p, len, 0);
        if (n <= 0) return false;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return true;
}

struct Answer {
    Done d{};
    std::string message;
};

Answer read_answer(int fd) {
    Answer a;
    if (!read_exact(fd, &a.d, sizeof a.d)) {
        a.d.status = 1;  // (no answer: fails every check)
        a.d.id = UINT64_MAX;
        return a;
    }
    a.message.resize(a.d.message_len);
    if (!read_exact(fd, a.message.data(), a.message.size())) a.d.status = 1;
    return a;
}

// One record, with descriptors attached when fds is not empty.
bool send_record(int sock, const Request &r, const std::vector<int> &fds = {}) {
    iovec iov{const_cast<Request *>(&r), sizeof r};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(4 * sizeof(int))] = {};
    if (!fds.empty()) {
        mh.msg_control = ctrl;
        mh.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
        cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
        memcpy(CMSG_DATA(cm), fds.data(), fds.size() * sizeof(int));
    }
    return sendmsg(sock, &mh, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof r);
}

int stage_memfd(uint64_t size, bool seal) {
    int fd = memfd_create("forged-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0 || posix_fallocate(fd, 0, static_cast<off_t>(size)))
        return -1;
    if (seal && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return -1;
    return fd;
}

TEST_F(ShmStageTest, ForgedAreasAndBlocksAreRefusedAndTouchNothingOutside) {
    auto b = make();
    ASSERT_TRUE(b);
    constexpr uint64_t kLen = 64 * kKiB, kPage = 4096, kArea = kMiB;
    Buffer rw_all(kLen + 2 * kPage), ro_all(kLen + 2 * kPage);
    uint8_t *rw = rw_all.data() + kPage, *ro = ro_all.data() + kPage;
    memset(rw_all.data(), 0xA5, rw_all.size());
    memset(ro_all.data(), 0x3C, ro_all.size());
    fill_pattern(rw, kLen, 9);
    uint64_t h;
    ASSERT_EQ(b->register_mem(rw, kLen, kRW, &h), 0);
    ASSERT_EQ(b->register_mem(ro, kLen, FERRY_ACCESS_REMOTE_READ, &h), 0);
    alignas(16) static uint64_t probe[2] = {0x5151515151515151ull, 0x5151515151515151ull};
    RawShmClient raw = raw_shm_client(b->endpoint(), probe);
    ASSERT_GE(raw.fd, 0);
    const int sock = raw.fd;
    const Hello &hello = raw.hello;
    ASSERT_EQ(send(sock, &hello, sizeof hello, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof hello));
    HelloAck ack{};
    ASSERT_TRUE(read_exact(sock, &ack, sizeof ack));
    ASSERT_EQ(ack.status, 0) << ack.message;

    // Offers that must be refused, each answered on its own; the connection stays usable.
    Request offer{};
    offer.opcode = kOpStageOffer;
    offer.local_fd = -1;
    offer.length = kArea;
    int pipefd[2];
    ASSERT_EQ(pipe(pipefd), 0);
    const int unsealed = stage_memfd(kArea, false), small = stage_memfd(kArea / 2, true);
    ASSERT_TRUE(unsealed >= 0 && small >= 0);
    struct Bad {
        const char *what;
        std::vector<int> fds;
    };
    for (const Bad &bad : {Bad{"no descriptor", {}}, Bad{"a pipe", {pipefd[0]}}, Bad{"an unsealed memfd", {unsealed}},
                           Bad{"a memfd of another size", {small}}, Bad{"two descriptors", {small, unsealed}}}) {
        SCOPED_TRACE(bad.what);
        ASSERT_TRUE(send_record(sock, offer, bad.fds));
        Answer a = read_answer(sock);
        EXPECT_EQ(a.d.id, 0u);
        EXPECT_EQ(a.d.status, -EBADF) << a.message;
    }
    for (int fd : {pipefd[0], pipefd[1], unsealed, small}) close(fd);
    // A staged batch before any area was accepted.
    Request batch{};
    batch.id = 7;
    batch.opcode = kOpStageBatch;
    batch.local_fd = -1;
    batch.length = 4096;
    batch.local_addr = 1;
    ASSERT_TRUE(send_record(sock, batch));
    Answer none = read_answer(sock);
    EXPECT_EQ(none.d.id, 7u);
    EXPECT_EQ(none.d.status, -EINVAL) << none.message;

    const int area_fd = stage_memfd(kArea, true);
    ASSERT_GE(area_fd, 0);
    ASSERT_TRUE(send_record(sock, offer, {area_fd}));
    Answer ok = read_answer(sock);
    ASSERT_EQ(ok.d.status, 0) << ok.message;
    ASSERT_TRUE(send_record(sock, offer, {area_fd}));  // a second area
    EXPECT_EQ(read_answer(sock).d.status, -EBADF);
    auto *area = static_cast<uint8_t *>(mmap(nullptr, kArea, PROT_READ | PROT_WRITE, MAP_SHARED, area_fd, 0));
    ASSERT_NE(area, MAP_FAILED);
    close(area_fd);
    memset(area, 0x77, kArea);

    // Blocks that do not fit: one -EINVAL each, nothing read.
    struct Frame {
        uint64_t off, len, count;
    };
    uint64_t id = 100;
    for (const Frame &f : {Frame{kArea, 4096, 1}, Frame{kArea - 64, 4096, 1}, Frame{64, UINT64_MAX - 32, 1},
                           Frame{65, 4096, 1}, Frame{0, 4096, 0}, Frame{0, kArea, kStageMaxOps + 1}, Frame{0, 64, 1}}) {
        batch.id = ++id;
        batch.remote_addr = f.off;
        batch.length = f.len;
        batch.local_addr = f.count;
        ASSERT_TRUE(send_record(sock, batch));
        Answer a = read_answer(sock);
        EXPECT_EQ(a.d.id, id);
        EXPECT_EQ(a.d.status, -EINVAL) << a.message;
        EXPECT_EQ(a.d.reserved, 0u);
    }

    // One block at 4096 of 4 KiB: good and bad ops; per failed op a Done, then the block's.
    const uint64_t off = 4096, blen = 4096;
    const uint64_t data = off + sizeof(StageHead) + 16 * sizeof(StageOp);
    const auto rwa = reinterpret_cast<uint64_t>(rw), roa = reinterpret_cast<uint64_t>(ro);
    struct OpCase {
        StageOp op;
        int expect;
    };
    std::vector<OpCase> cases = {
        {{rwa + 128, data, 64, FERRY_OP_WRITE}, 0},                    // 0: lands in rw
        {{rwa + 1024, data + 64, 64, FERRY_OP_READ}, 0},               // 1: rw into its slot
        {{rwa, off + blen, 64, FERRY_OP_READ}, -EINVAL},               // 2: slot after the block
        {{rwa, off - 64, 64, FERRY_OP_READ}, -EINVAL},                 // 3: slot before it
        {{rwa, data, UINT32_MAX, FERRY_OP_READ}, -EINVAL},             // 4: slot longer than it
        {{rwa + kLen - 32, data + 128, 64, FERRY_OP_WRITE}, -EFAULT},  // 5: past the region's end
        {{UINT64_MAX - 16, data + 128, 64, FERRY_OP_WRITE}, -EFAULT},  // 6: wraps
        {{roa, data + 128, 64, FERRY_OP_WRITE}, -EACCES},              // 7: read-only region
        {{roa + 64, data + 192, 64, FERRY_OP_READ}, 0},                // 8: reading it is fine
        {{rwa, data + 256, 64, 77}, -EINVAL},                          // 9: opcode
        {{rwa, data + 256, 0, FERRY_OP_WRITE}, -EINVAL},               // 10: empty
        {{rwa - kPage, data + 256, 64, FERRY_OP_WRITE}, -EFAULT},      // 11: the canary page
    };
    fill_pattern(area + data, 64, 21);
    StageHead head{};
    head.state = kStagePosted;
    head.count = static_cast<uint32_t>(cases.size());
    memcpy(area + off, &head, sizeof head);
    for (size_t i = 0; i < cases.size(); ++i)
        memcpy(area + off + sizeof head + i * sizeof(StageOp), &cases[i].op, sizeof(StageOp));
    std::vector<uint8_t> area_before(area, area + kArea);
    batch.id = ++id;
    batch.remote_addr = off;
    batch.length = blen;
    batch.local_addr = cases.size();
    ASSERT_TRUE(send_record(sock, batch));
    std::vector<int> got(cases.size(), 0);
    for (;;) {
        Answer a = read_answer(sock);
        ASSERT_EQ(a.d.id, id) << "status " << a.d.status << ": " << a.message;
        if (a.d.reserved == 0) {
            EXPECT_EQ(a.d.status, 0) << a.message;
            break;
        }
        ASSERT_LE(a.d.reserved, cases.size());
        got[a.d.reserved - 1] = a.d.status;
        EXPECT_NE(a.message.find("shm: pid"), std::string::npos) << a.message;
    }
    for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(got[i], cases[i].expect) << "op " << i;
    EXPECT_EQ(find_mismatch(rw + 128, 64, 21), SIZE_MAX) << "the good WRITE did not land";
    EXPECT_EQ(memcmp(area + data + 64, rw + 1024, 64), 0) << "the good READ did not land in its slot";
    EXPECT_EQ(memcmp(area + data + 192, ro + 64, 64), 0);
    // Only the block's state word and the two READ slots changed in the area.
    for (uint64_t i = 0; i < kArea; ++i) {
        const bool may = i < off + 4 && i >= off;
        const bool slot = (i >= data + 64 && i < data + 128) || (i >= data + 192 && i < data + 256);
        if (!may && !slot && area[i] != area_before[i]) {
            ADD_FAILURE() << "area byte " << i << " changed";
            break;
        }
    }
    for (uint64_t i = 0; i < kPage; ++i) {
        ASSERT_EQ(rw_all.data()[i], 0xA5) << "the page before the region changed";
        ASSERT_EQ(rw_all.data()[kPage + kLen + i], 0xA5) << "the page after the region changed";
    }
    for (uint64_t i = 0; i < ro_all.size(); ++i) ASSERT_EQ(ro_all.data()[i], 0x3C) << "read-only memory changed";

    // The same block again: it is claimed now, so the serving side treats it as revoked.
    batch.id = ++id;
    ASSERT_TRUE(send_record(sock, batch));
    Answer again = read_answer(sock);
    EXPECT_EQ(again.d.status, -ECANCELED) << again.message;
    // A block the initiator revoked moves nothing.
    head.state = kStageRevoked;
    memcpy(area + off, &head, sizeof head);
    StageOp w{rwa + 4096, data, 64, FERRY_OP_WRITE};
    memcpy(area + off + sizeof head, &w, sizeof w);
    fill_pattern(area + data, 64, 33);
    batch.id = ++id;
    batch.local_addr = 1;
    ASSERT_TRUE(send_record(sock, batch));
    EXPECT_EQ(read_answer(sock).d.status, -ECANCELED);
    EXPECT_NE(find_mismatch(rw + 4096, 64, 33), SIZE_MAX) << "a revoked block was copied";
    munmap(area, kArea);
    close(sock);
}

// Four threads, each its own batches of 1 to 200 small READs and WRITEs (1 to 3000 bytes) to one
// peer process; every WRITE lands where it should, every READ brings the peer's bytes.
TEST_F(ShmStageTest, ConcurrentBatchesOfSmallOpsLandByteExact) {
    auto a = make();
    ASSERT_TRUE(a);
    constexpr uint64_t kPeer = 4 * kMiB, kSlice = kPeer / 4;
    ChildPeer child(shm_path(), kPeer, kRW, {});
    ASSERT_TRUE(child.ok()) << child.error();
    ASSERT_TRUE(child.fill(0, kPeer, 51));
    uint64_t peer, rmem;
    ASSERT_EQ(a->connect(child.endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, child.addr(), kPeer, kRW, &rmem), 0);
    std::vector<std::unique_ptr<Buffer>> locals;
    std::vector<uint64_t> handles(4);
    for (int t = 0; t < 4; ++t) {
        locals.push_back(std::make_unique<Buffer>(kSlice));
        ASSERT_EQ(a->register_mem(locals[t]->data(), kSlice, 0, &handles[t]), 0);
    }
    std::vector<uint8_t> all(kPeer);  // the child's bytes as filled
    fill_pattern(all.data(), kPeer, 51);
    std::atomic<bool> failed{false};
    for (int round = 0; round < 20 && !failed; ++round) {
        std::vector<std::thread> threads;
        std::vector<std::vector<ferry_xfer_op_t>> planned(4);
        for (int t = 0; t < 4; ++t)
            threads.emplace_back([&, t] {
                // Thread t owns the peer's slice t: its first half is written, its second half read.
                Buffer &loc = *locals[t];
                auto &ops = planned[t];
                const size_t n = 1 + (round * 37 + t * 11) % 200;
                uint64_t at = 0;
                for (size_t i = 0; i < n && at < kSlice / 2 - 3000; ++i) {
                    const uint64_t len = 1 + (i * 997 + round) % 3000;
                    const bool write = (i + t) % 2 == 0;
                    const uint64_t remote = child.addr() + t * kSlice + (write ? 0 : kSlice / 2) + at;
                    if (write) fill_pattern(loc.data() + at, len, 1000 + round * 8 + t + at);
                    else memset(loc.data() + at, 0, len);
                    ops.push_back(make_op(write ? FERRY_OP_WRITE : FERRY_OP_READ, loc.addr() + at, handles[t], remote,
                                          rmem, len, (uint64_t(t) << 32) | i));
                    at += len + 64;
                }
                if (a->submit(peer, ops) != 0) failed = true;
            });
        for (auto &th : threads) th.join();
        ASSERT_FALSE(failed) << a->last_error();
        size_t submitted = 0;
        for (auto &ops : planned) submitted += ops.size();
        auto c = a->wait(submitted);
        ASSERT_EQ(c.size(), submitted);
        for (const auto &x : c) ASSERT_EQ(x.status, 0) << x.message;
        for (int t = 0; t < 4; ++t) {
            size_t writes_checked = 0;
            for (const auto &op : planned[t]) {
                const uint8_t *local = reinterpret_cast<const uint8_t *>(op.local_addr);
                if (op.opcode == FERRY_OP_READ) {
                    ASSERT_EQ(memcmp(local, all.data() + (op.remote_addr - child.addr()), op.length), 0)
                        << "round " << round << " thread " << t << ": a READ brought other bytes";
                } else if (writes_checked++ < 3) {
                    uint64_t hsh;
                    ASSERT_TRUE(child.hash(op.remote_addr - child.addr(), op.length, &hsh));
                    ASSERT_EQ(hsh, fnv1a(local, op.length)) << "round " << round << " thread " << t;
                }
            }
        }
    }
}

// A peer killed with batches of small ops in flight: every op ends (succeeded or failed by the
// connection's end) well within the op timeout, and a new peer works afterwards.
TEST_F(ShmStageTest, PeerKilledWithSmallBatchesInFlightEndsThemAll) {
    auto a = make({{"op_timeout_ms", "20000"}});
    ASSERT_TRUE(a);
    Buffer loc(kMiB);
    uint64_t hl;
    ASSERT_EQ(a->register_mem(loc.data(), loc.size(), 0, &hl), 0);
    for (int round = 0; round < 3; ++round) {
        ChildPeer child(shm_path(), kMiB, kRW, {});
        ASSERT_TRUE(child.ok()) << child.error();
        uint64_t peer, rmem;
        ASSERT_EQ(a->connect(child.endpoint(), &peer), 0) << a->last_error();
        ASSERT_EQ(a->import_mem(peer, child.addr(), kMiB, kRW, &rmem), 0);
        size_t total = 0;
        const auto start = std::chrono::steady_clock::now();
        std::thread killer([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(20 + round * 15));
            child.kill_now();
        });
        for (int b = 0; b < 200; ++b) {
            std::vector<ferry_xfer_op_t> ops;
            for (size_t i = 0; i < 128; ++i)
                ops.push_back(make_op(i % 2 ? FERRY_OP_READ : FERRY_OP_WRITE, loc.addr() + i * 4096, hl,
                                      child.addr() + i * 4096, rmem, 64, total + i));
            if (a->submit(peer, ops) != 0) break;  // the connection is gone: refused whole
            total += ops.size();
        }
        killer.join();
        auto c = a->wait(total, std::chrono::seconds(15));
        EXPECT_EQ(c.size(), total) << "ops still pending after the peer was killed";
        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
        for (const auto &x : c) {
            if (x.status != 0) {
                EXPECT_EQ(x.status, -ECONNRESET) << x.message;
            }
        }
        a->disconnect(peer);
    }
}

// Staged READs and WRITEs to a stopped peer time out; their blocks were revoked before the peer
// could claim them, so after it resumes neither a READ's buffer nor a WRITE's target changes.
TEST_F(ShmStageTest, StagedOpsToAStoppedPeerTimeOutAndNeverLandAfterwards) {
    auto a = make({{"op_timeout_ms", "1000"}});
    ASSERT_TRUE(a);
    ChildPeer child(shm_path(), kMiB, kRW, {});
    ASSERT_TRUE(child.ok()) << child.error();
    ASSERT_TRUE(child.fill(0, kMiB, 61));
    Buffer loc(256 * kKiB);
    memset(loc.data(), 0xEE, loc.size());
    uint64_t hl, peer, rmem;
    ASSERT_EQ(a->register_mem(loc.data(), loc.size(), 0, &hl), 0);
    ASSERT_EQ(a->connect(child.endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, child.addr(), kMiB, kRW, &rmem), 0);
    // Answered after the staging offer's answer: the area is in use from here on.
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, loc.addr() + 200 * kKiB, hl, child.addr(), rmem, 64, 9999)}), 0);
    ASSERT_EQ(a->wait(1).size(), 1u);
    memset(loc.data(), 0xEE, loc.size());
    std::vector<ferry_xfer_op_t> ops;
    for (size_t i = 0; i < 256; ++i)  // READs into [0, 64 KiB), WRITEs of 0xEE to the peer's second half
        ops.push_back(make_op(i % 2 ? FERRY_OP_WRITE : FERRY_OP_READ, loc.addr() + i * 512, hl,
                              child.addr() + (i % 2 ? kMiB / 2 : 0) + i * 512, rmem, 100, i));
    child.stop();
    ASSERT_EQ(a->submit(peer, ops), 0) << a->last_error();
    auto c = a->wait(256, std::chrono::seconds(30));
    ASSERT_EQ(c.size(), 256u);
    for (const auto &x : c) EXPECT_EQ(x.status, -ETIMEDOUT) << x.message;
    child.resume();
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, loc.addr() + 200 * kKiB, hl, child.addr(), rmem, 64, 1000)}), 0);
    auto p = a->wait(1, std::chrono::seconds(30));
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].status, 0) << p[0].message;
    size_t landed = 0;
    for (size_t i = 0; i < 128 * kKiB; ++i) landed += loc.data()[i] != 0xEE;
    EXPECT_EQ(landed, 0u) << "bytes landed in READ buffers after their ops timed out";
    std::vector<uint8_t> expect(kMiB);
    fill_pattern(expect.data(), kMiB, 61);
    uint64_t h;
    ASSERT_TRUE(child.hash(0, kMiB, &h));
    EXPECT_EQ(h, fnv1a(expect.data(), kMiB)) << "a WRITE that timed out landed after the peer resumed";
}

}  // namespace
}  // namespace ferry_test

#endif  // FERRY_TEST_SHM_PLUGIN
