// shm.so beyond the conformance suite, through the plain-C ABI: the probe's report, connect()
// refusing peers the kernel will not let it access (another user, another network namespace),
// deregistration that waits for running copies, an initiator killed while the serving side
// copies for it, and concurrent submitters.
#include "harness.hpp"
#include "peer_process.hpp"
#include "shm_test_util.hpp"

#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>

#ifdef FERRY_TEST_SHM_PLUGIN

namespace ferry_test {
namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr uint64_t kMiB = 1ull << 20;

class ShmTest : public ShmPluginTest {};

// A shm instance in a forked child that first changes something about itself (its user, its
// network namespace) and then serves one RW buffer until the parent closes the pipe.
struct ForkedServer {
    pid_t pid = -1;
    int to_child = -1;
    std::vector<uint8_t> endpoint;
    uint64_t addr = 0;
    std::string error;

    // `prepare` runs in the child before the instance exists; returns "" or why it failed.
    template <class F>
    ForkedServer(const Plugin &plugin, size_t size, F prepare) {
        int up[2], down[2];
        if (pipe(up) != 0 || pipe(down) != 0) {
            error = "pipe";
            return;
        }
        pid = fork();
        if (pid == 0) {
            close(up[0]);
            close(down[1]);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            std::string why = prepare();
            std::string reply;
            std::unique_ptr<Instance> inst;
            std::unique_ptr<Buffer> buf;
            if (why.empty()) {
                inst = std::make_unique<Instance>(plugin, Options{});
                buf = std::make_unique<Buffer>(size);
                uint64_t h;
                if (inst->create_rc() != 0 || inst->register_mem(buf->data(), size, kRW, &h) != 0)
                    why = "instance: " + inst->last_error();
            }
            if (!why.empty()) {
                reply = "E" + why;
            } else {
                auto ep = inst->endpoint();
                reply = "OK" + std::to_string(buf->addr()) + ":" + std::string(ep.begin(), ep.end());
            }
            uint32_t len = static_cast<uint32_t>(reply.size());
            (void)!write(up[1], &len, 4);
            (void)!write(up[1], reply.data(), len);
            char c;
            (void)!read(down[0], &c, 1);  // until the parent closes
            _exit(0);
        }
        close(up[1]);
        close(down[0]);
        to_child = down[1];
        uint32_t len = 0;
        std::string reply;
        if (read(up[0], &len, 4) == 4) {
            reply.resize(len);
            size_t got = 0;
            while (got < len) {
                ssize_t n = read(up[0], reply.data() + got, len - got);
                if (n <= 0) break;
                got += static_cast<size_t>(n);
            }
        }
        close(up[0]);
        if (reply.rfind("OK", 0) != 0) {
            error = reply.empty() ? "child died" : reply.substr(1);
            return;
        }
        auto colon = reply.find(':');
        addr = std::stoull(reply.substr(2, colon - 2));
        endpoint.assign(reply.begin() + static_cast<ptrdiff_t>(colon) + 1, reply.end());
    }
    ~ForkedServer() {
        if (to_child >= 0) close(to_child);
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    }
};

TEST_F(ShmTest, ProbeNamesTheMechanismAndTheKernelPolicy) {
    ferry_probe_result_t r{};
    ASSERT_EQ((*plugin)->probe(nullptr, 0, &r), 0);
    EXPECT_EQ(r.available, 1) << r.reason;
    EXPECT_NE(std::string(r.reason).find("process_vm_readv"), std::string::npos) << r.reason;
    EXPECT_NE((*plugin)->caps & FERRY_CAP_INTRA_NODE, 0u);
    EXPECT_EQ((*plugin)->caps & FERRY_CAP_INTER_NODE, 0u) << "shm must never be picked across hosts";
}

TEST_F(ShmTest, ConnectRefusedWhenThePeerRunsAsAnotherUser) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to start a peer as another user";
    // The child serves as uid 65534; it cannot read our (root's) memory, so its access probe of
    // us fails and connect() must say why.
    ForkedServer child(*plugin, kMiB, [] {
        if (setgid(65534) != 0 || setuid(65534) != 0) return std::string("setuid: ") + strerror(errno);
        return std::string();
    });
    ASSERT_TRUE(child.error.empty()) << child.error;
    auto a = make();
    ASSERT_TRUE(a);
    uint64_t peer = 777;
    int rc = a->connect(child.endpoint, &peer);
    EXPECT_EQ(rc, -EPERM) << a->last_error();
    EXPECT_EQ(peer, 777u) << "output written on failure";
    EXPECT_NE(a->last_error().find("different users"), std::string::npos) << a->last_error();
    std::cout << "refusal: " << a->last_error() << "\n";
}

TEST_F(ShmTest, ConnectRefusedAcrossNetworkNamespaces) {
    ForkedServer child(*plugin, kMiB, [] {
        if (unshare(CLONE_NEWNET) != 0) return std::string("unshare(CLONE_NEWNET): ") + strerror(errno);
        return std::string();
    });
    if (child.error.rfind("unshare", 0) == 0) GTEST_SKIP() << child.error;
    ASSERT_TRUE(child.error.empty()) << child.error;
    auto a = make();
    ASSERT_TRUE(a);
    uint64_t peer;
    EXPECT_LT(a->connect(child.endpoint, &peer), 0);
    EXPECT_NE(a->last_error().find("network namespace"), std::string::npos) << a->last_error();
}

// Deregistration on the serving side returns only once no copy touches the region: whatever
// we write into it afterwards must survive every transfer still queued for it.
TEST_F(ShmTest, DeregisterWaitsForRunningCopies) {
    auto a = make({{"copy_threads", "2"}, {"chunk_size", "256k"}});
    auto b = make();
    ASSERT_TRUE(a && b);
    const size_t sz = 64 * kMiB;
    Buffer src(sz), tgt(sz);
    fill_pattern(src.data(), sz, 3);
    uint64_t hs, ht, peer, rmem;
    ASSERT_EQ(a->register_mem(src.data(), sz, 0, &hs), 0);
    ASSERT_EQ(b->register_mem(tgt.data(), sz, kRW, &ht), 0);
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, tgt.addr(), sz, kRW, &rmem), 0);
    std::vector<ferry_xfer_op_t> ops;
    for (int round = 0; round < 4; ++round)
        for (uint64_t off = 0; off < sz; off += 4 * kMiB)
            ops.push_back(make_op(FERRY_OP_WRITE, src.addr() + off, hs, tgt.addr() + off, rmem, 4 * kMiB, ops.size()));
    ASSERT_EQ(a->submit(peer, ops), 0) << a->last_error();
    auto c = a->wait(1);  // copies are under way (wait may return more than one)
    ASSERT_GE(c.size(), 1u);
    ASSERT_EQ(b->deregister_mem(ht), 0) << b->last_error();
    memset(tgt.data(), 0x5a, sz);
    auto rest = a->wait(ops.size() - c.size());
    c.insert(c.end(), rest.begin(), rest.end());
    ASSERT_EQ(c.size(), ops.size());
    size_t refused = 0;
    for (const auto &x : c)
        if (x.status != 0) {  // refused: submitted before, but reached the serving side after
            ++refused;
            EXPECT_EQ(x.status, -EFAULT) << x.message;
        }
    for (size_t i = 0; i < sz; ++i)
        ASSERT_EQ(tgt.data()[i], 0x5a) << "byte " << i << " written after deregister_mem returned";
    std::cout << refused << " of " << ops.size() << " ops refused after the deregistration\n";
}

// The initiator dies while the serving side copies for it: the serving side must survive,
// finish or drop those copies, and keep serving everyone else.
TEST_F(ShmTest, ServingSideSurvivesAnInitiatorKilledMidCopy) {
    const size_t sz = 64 * kMiB;
    Buffer tgt(sz);
    int ready[2], endpoint[2];
    ASSERT_EQ(pipe(ready), 0);
    ASSERT_EQ(pipe(endpoint), 0);
    // The child is forked before this process starts any thread (the serving instance's), so it
    // may start its own: a child of a multithreaded process must not (ThreadSanitizer refuses).
    pid_t pid = fork();
    if (pid == 0) {  // initiator: endless large writes and reads
        close(endpoint[1]);
        std::vector<uint8_t> ep(4096);
        ssize_t got = read(endpoint[0], ep.data(), ep.size());
        if (got <= 0) _exit(3);
        ep.resize(static_cast<size_t>(got));
        Instance a(*plugin, {});
        Buffer loc(sz);
        uint64_t hl, peer, rmem;
        if (a.create_rc() != 0 || a.register_mem(loc.data(), sz, 0, &hl) != 0 || a.connect(ep, &peer) != 0 ||
            a.import_mem(peer, tgt.addr(), sz, kRW, &rmem) != 0)
            _exit(1);
        std::vector<ferry_xfer_op_t> ops;
        for (uint64_t off = 0; off < sz; off += 8 * kMiB)
            ops.push_back(make_op(off % 16 ? FERRY_OP_READ : FERRY_OP_WRITE, loc.addr() + off, hl, tgt.addr() + off,
                                  rmem, 8 * kMiB, off));
        for (int i = 0;; ++i) {
            if (a.submit(peer, ops) != 0) _exit(2);
            if (i == 1) (void)!write(ready[1], "r", 1);
            a.wait(ops.size());
        }
    }
    struct Reap {  // also when an assertion below returns early
        pid_t pid;
        ~Reap() {
            if (pid <= 0) return;
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    } reap{pid};
    close(endpoint[0]);
    auto b = make({{"copy_threads", "2"}, {"chunk_size", "1m"}});
    ASSERT_TRUE(b);
    uint64_t ht;
    ASSERT_EQ(b->register_mem(tgt.data(), sz, kRW, &ht), 0);
    const std::vector<uint8_t> ep = b->endpoint();
    ASSERT_LT(ep.size(), 4096u);
    ASSERT_EQ(write(endpoint[1], ep.data(), ep.size()), static_cast<ssize_t>(ep.size()));
    close(endpoint[1]);
    close(ready[1]);
    char c;
    ASSERT_EQ(read(ready[0], &c, 1), 1) << "initiator child failed to start";
    close(ready[0]);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    reap.pid = -1;
    // Still serving: a fresh initiator moves data, and deregistration does not hang.
    auto a = make();
    ASSERT_TRUE(a);
    Buffer loc(kMiB);
    fill_pattern(loc.data(), kMiB, 9);
    uint64_t hl, peer, rmem;
    ASSERT_EQ(a->register_mem(loc.data(), kMiB, 0, &hl), 0);
    ASSERT_EQ(a->connect(ep, &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, tgt.addr(), sz, kRW, &rmem), 0);
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, loc.addr(), hl, tgt.addr() + 5, rmem, kMiB, 1)}), 0);
    auto done = a->wait(1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 0) << done[0].message;
    EXPECT_EQ(find_mismatch(tgt.data() + 5, kMiB, 9), SIZE_MAX);
    EXPECT_EQ(b->deregister_mem(ht), 0) << b->last_error();
}

TEST_F(ShmTest, ConcurrentSubmittersToOnePeer) {
    auto a = make({{"copy_threads", "3"}, {"chunk_size", "64k"}, {"inline_size", "4k"}});
    auto b = make();
    ASSERT_TRUE(a && b);
    const int threads = 4;
    const size_t per = 8 * kMiB;
    Buffer src(threads * per), back(threads * per), tgt(threads * per);
    for (int t = 0; t < threads; ++t) fill_pattern(src.data() + t * per, per, 50 + t);
    uint64_t hs, hb, ht, peer, rmem;
    ASSERT_EQ(a->register_mem(src.data(), src.size(), 0, &hs), 0);
    ASSERT_EQ(a->register_mem(back.data(), back.size(), 0, &hb), 0);
    ASSERT_EQ(b->register_mem(tgt.data(), tgt.size(), kRW, &ht), 0);
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0);
    ASSERT_EQ(a->import_mem(peer, tgt.addr(), tgt.size(), kRW, &rmem), 0);
    // Each thread submits its own writes; one collector drains every completion.
    std::atomic<int> submit_errors{0};
    std::vector<std::thread> workers;
    const size_t op_len = 100 * 1024 + 3;
    size_t total = 0;
    for (int t = 0; t < threads; ++t) total += (per + op_len - 1) / op_len;
    for (int t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
            std::vector<ferry_xfer_op_t> ops;
            for (uint64_t off = 0; off < per; off += op_len) {
                uint64_t base = t * per + off, len = std::min<uint64_t>(op_len, per - off);
                ops.push_back(make_op(FERRY_OP_WRITE, src.addr() + base, hs, tgt.addr() + base, rmem, len, base));
            }
            for (size_t i = 0; i < ops.size(); i += 7) {
                std::vector<ferry_xfer_op_t> batch(ops.begin() + i, ops.begin() + std::min(ops.size(), i + 7));
                if (a->submit(peer, batch) != 0) ++submit_errors;
            }
        });
    for (auto &w : workers) w.join();
    ASSERT_EQ(submit_errors.load(), 0);
    auto c = a->wait(total);
    ASSERT_EQ(c.size(), total);
    std::set<uint64_t> seen;
    for (const auto &x : c) {
        EXPECT_EQ(x.status, 0) << x.message;
        EXPECT_TRUE(seen.insert(x.user_data).second);
    }
    for (int t = 0; t < threads; ++t)
        EXPECT_EQ(find_mismatch(tgt.data() + t * per, per, 50 + t), SIZE_MAX) << "thread " << t;
}

// adopt_memfd: a page-aligned anonymous region moves into a memfd in place (contents kept, same
// addresses) and the serving side, in another process, copies through its mapping of it.
TEST_F(ShmTest, AdoptedRegionsKeepTheirBytesAndMoveThroughTheMemfd) {
    auto a = make({{"adopt_memfd", "true"}});
    ASSERT_TRUE(a);
    const size_t sz = 8 * kMiB;
    Buffer loc(sz);
    fill_pattern(loc.data(), sz, 12);
    uint64_t hl;
    ASSERT_EQ(a->register_mem(loc.data(), sz, 0, &hl), 0) << a->last_error();
    EXPECT_EQ(find_mismatch(loc.data(), sz, 12), SIZE_MAX) << "registration changed the region's bytes";
    std::ifstream maps("/proc/self/maps");
    std::string line, mapping;
    char start[32];
    snprintf(start, sizeof start, "%lx-", static_cast<unsigned long>(loc.addr()));
    while (std::getline(maps, line))
        if (line.rfind(start, 0) == 0) mapping = line;
    EXPECT_NE(mapping.find("memfd:ferry-shm-region"), std::string::npos) << mapping;
    ChildPeer child(shm_path(), sz, kRW, {{"adopt_memfd", "true"}});  // both ends opt in
    ASSERT_TRUE(child.ok()) << child.error();
    uint64_t peer, rmem;
    ASSERT_EQ(a->connect(child.endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, child.addr(), sz, kRW, &rmem), 0);
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, loc.addr() + 3, hl, child.addr() + 1, rmem, sz - 9, 1)}), 0);
    auto c = a->wait(1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(c[0].status, 0) << c[0].message;
    uint64_t h = 0;
    ASSERT_TRUE(child.hash(1, sz - 9, &h));
    EXPECT_EQ(h, fnv1a(loc.data() + 3, sz - 9));
    ASSERT_TRUE(child.fill(0, sz, 13));
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, loc.addr(), hl, child.addr(), rmem, sz, 2)}), 0);
    c = a->wait(1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(c[0].status, 0) << c[0].message;
    EXPECT_EQ(find_mismatch(loc.data(), sz, 13), SIZE_MAX);
    // Memory that does not qualify (not page-aligned) stays on cross-memory attach and works.
    Buffer odd(64 * 1024);
    fill_pattern(odd.data(), odd.size(), 14);
    uint64_t ho;
    ASSERT_EQ(a->register_mem(odd.data() + 100, 5000, 0, &ho), 0) << a->last_error();
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, odd.addr() + 100, ho, child.addr(), rmem, 5000, 3)}), 0);
    c = a->wait(1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(c[0].status, 0) << c[0].message;
    ASSERT_TRUE(child.hash(0, 5000, &h));
    EXPECT_EQ(h, fnv1a(odd.data() + 100, 5000));
    EXPECT_TRUE(child.exit_cleanly());
}

// The initiator is idle (its I/O thread asleep without a timeout) when
// one op goes to a peer that is stopped. The op must still fail by op_timeout_ms.
TEST_F(ShmTest, AnOpToAStoppedPeerFailsByItsTimeoutEvenWhenIdle) {
    auto a = make({{"op_timeout_ms", "1000"}});
    ASSERT_TRUE(a);
    ChildPeer child(shm_path(), kMiB, kRW, {});
    ASSERT_TRUE(child.ok()) << child.error();
    Buffer loc(kMiB);
    uint64_t hl, peer, rmem;
    ASSERT_EQ(a->register_mem(loc.data(), kMiB, 0, &hl), 0);
    ASSERT_EQ(a->connect(child.endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, child.addr(), kMiB, kRW, &rmem), 0);
    child.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // idle: nothing in flight
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, loc.addr(), hl, child.addr(), rmem, 4096, 1)}), 0);
    auto c = a->wait(1, std::chrono::seconds(15));
    auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    ASSERT_EQ(c.size(), 1u) << "still pending after 15 s with op_timeout_ms=1000";
    EXPECT_EQ(c[0].status, -ETIMEDOUT) << c[0].message;
    EXPECT_LT(took.count(), 4000) << "op_timeout_ms=1000";
    std::cout << "failed after " << took.count() << " ms: " << c[0].message << "\n";
    child.resume();
}

// With cross-memory attach the serving side writes a READ into our buffer.
// Once an op was reported failed, no byte may land in its buffer, even when the stopped serving
// side resumes with the requests still queued. Two rounds: stopped before the batch, and
// stopped in the middle of one.
TEST_F(ShmTest, NoByteLandsInABufferAfterItsReadFailed) {
    auto a = make({{"op_timeout_ms", "1000"}});
    ASSERT_TRUE(a);
    const size_t op = kMiB, n = 48;
    // One copy thread: pieces are copied in the order requests arrived, so the probe op below
    // (larger than inline_size, queued after the others) completes only after every earlier
    // piece was taken and its copy attempted.
    ChildPeer child(shm_path(), n * op, kRW, {{"copy_threads", "1"}, {"chunk_size", "64k"}});
    ASSERT_TRUE(child.ok()) << child.error();
    ASSERT_TRUE(child.fill(0, n * op, 41));
    Buffer loc(n * op), probe(op);
    uint64_t hl, hp, peer, rmem;
    ASSERT_EQ(a->register_mem(loc.data(), loc.size(), 0, &hl), 0);
    ASSERT_EQ(a->register_mem(probe.data(), probe.size(), 0, &hp), 0);
    ASSERT_EQ(a->connect(child.endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, child.addr(), n * op, kRW, &rmem), 0);
    for (int round = 0; round < 2; ++round) {
        memset(loc.data(), 0xEE, loc.size());
        std::vector<ferry_xfer_op_t> ops;
        for (size_t i = 0; i < n; ++i)
            ops.push_back(make_op(FERRY_OP_READ, loc.addr() + i * op, hl, child.addr() + i * op, rmem, op, i));
        if (round == 0) child.stop();
        ASSERT_EQ(a->submit(peer, ops), 0) << a->last_error();
        std::vector<ferry_completion_t> c;
        if (round == 1) {
            c = a->wait(1);  // under way
            child.stop();
        }
        std::vector<uint64_t> at_failure(n, 0);
        size_t failed = 0;
        while (c.size() < n) {
            auto more = a->wait(1, std::chrono::seconds(15));
            ASSERT_FALSE(more.empty()) << "ops still pending 15 s after op_timeout_ms=1000";
            c.insert(c.end(), more.begin(), more.end());
        }
        for (const auto &x : c)
            if (x.status != 0) {
                EXPECT_EQ(x.status, -ETIMEDOUT) << x.message;
                at_failure[x.user_data] = fnv1a(loc.data() + x.user_data * op, op) | 1;
                ++failed;
            }
        child.resume();
        // The serving side resumes with every old request queued; a new op behind them shows it
        // got through all of them.
        ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, probe.addr(), hp, child.addr(), rmem, op, 1000)}), 0);
        auto p = a->wait(1, std::chrono::seconds(30));
        ASSERT_EQ(p.size(), 1u);
        EXPECT_EQ(p[0].status, 0) << p[0].message;
        size_t changed = 0;
        for (size_t i = 0; i < n; ++i)
            if (at_failure[i] != 0 && (fnv1a(loc.data() + i * op, op) | 1) != at_failure[i]) ++changed;
        std::cout << "round " << round << ": " << failed << " of " << n << " READs failed, " << changed
                  << " of those buffers written after the failure\n";
        EXPECT_EQ(changed, 0u);
        if (round == 0) {
            EXPECT_EQ(failed, n);
        }
    }
}

TEST_F(ShmTest, BadOptionValuesNameTheKey) {
    for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"chunk_size", "1"}, {"inline_size", "1t"}, {"ptracer_any", "maybe"}, {"op_timeout_ms", "-1"}}) {
        Instance bad(*plugin, {{k, v}});
        EXPECT_EQ(bad.create_rc(), -EINVAL);
        EXPECT_NE(bad.last_error().find(k), std::string::npos) << bad.last_error();
    }
}

}  // namespace
}  // namespace ferry_test

#endif  // FERRY_TEST_SHM_PLUGIN
