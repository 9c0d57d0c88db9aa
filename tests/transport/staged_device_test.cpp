// tcp.so, shm.so and efa.so serving a peer's READ of, and WRITE into, DEVICE memory registered on the
// target (FERRY_CAP_STAGED_DEVICE): driven through the C ABI with a test host
// (staging_host.hpp) whose "device" memory is PROT_NONE, so a plugin that touches it crashes.
// Real sockets, real child processes for the kill tests (the binary re-executed).
#include "harness.hpp"
#include "staging_host.hpp"

#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>

namespace ferry_test {
namespace {

constexpr uint64_t kSlice = 256 * 1024;  // the test host's stage_slice_bytes
constexpr uint64_t kMiB = 1 << 20;
constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr const char *kInitiatorFlag = "--staged-initiator";
constexpr const char *kTargetFlag = "--staged-target";

struct StagedParam {
    std::string name;
    std::string path;
    Options options;
    // tcp wire requests of as many staging slices as the window: a READ copy failing after the
    // response's header left fails the connection (the op fails, the next one reconnects).
    bool read_fails_connection = false;
};

void PrintTo(const StagedParam &p, std::ostream *os) { *os << p.name; }

// FERRY_TEST_<NAME>_PLUGIN in the environment overrides the built-in path.
std::string plugin_path(const char *env, const char *built) {
    const char *e = std::getenv(env);
    return e != nullptr && *e != '\0' ? e : built;
}

std::vector<StagedParam> params() {
    std::vector<StagedParam> v;
#ifdef FERRY_TEST_TCP_PLUGIN
    // Wire requests of one staging slice (answered all-or-nothing), and of 4 (streamed).
    const std::string tcp = plugin_path("FERRY_TEST_TCP_PLUGIN", FERRY_TEST_TCP_PLUGIN);
    v.push_back({"tcp", tcp, {{"slice_size", "256k"}, {"lanes", "2"}}});
    // Wire requests of 2 slices (all-or-nothing groups that a bound of one slice cannot hold).
    v.push_back({"tcp_mid", tcp, {{"slice_size", "512k"}, {"lanes", "2"}}});
    v.push_back({"tcp_long", tcp, {{"slice_size", "1m"}, {"lanes", "1"}}, true});
#endif
#ifdef FERRY_TEST_SHM_PLUGIN
    // Pieces of two slices over two copy threads; and the initiator's memfd mapped (memcpy path).
    Options shm = {{"chunk_size", "512k"}, {"copy_threads", "2"}, {"inline_size", "0"}, {"ptracer_any", "true"}};
    const std::string so = plugin_path("FERRY_TEST_SHM_PLUGIN", FERRY_TEST_SHM_PLUGIN);
    v.push_back({"shm", so, shm});
    Options memfd = shm;
    memfd.push_back({"adopt_memfd", "true"});
    v.push_back({"shm_memfd", so, memfd});
#endif
#ifdef FERRY_TEST_EFA_PLUGIN
    // libfabric's tcp provider (no FI_HMEM): request/grant/done over control messages, RMA on
    // each granted buffer. Grants not taken within op_timeout_ms are taken back (the kill test).
    const std::string efa = plugin_path("FERRY_TEST_EFA_PLUGIN", FERRY_TEST_EFA_PLUGIN);
    v.push_back({"efa", efa, {{"provider", "tcp"}, {"op_timeout_ms", "10000"}}});
    // Local registrations split at 1 MiB: grants cross the initiator's MR boundaries.
    v.push_back({"efa_split", efa, {{"provider", "tcp"}, {"op_timeout_ms", "10000"}, {"max_mr_size", "1m"}}});
#endif
    return v;
}

std::string hex(const std::vector<uint8_t> &b) {
    static const char *d = "0123456789abcdef";
    std::string s;
    for (uint8_t c : b) {
        s += d[c >> 4];
        s += d[c & 15];
    }
    return s;
}

std::vector<uint8_t> unhex(const std::string &s) {
    std::vector<uint8_t> b;
    for (size_t i = 0; i + 1 < s.size(); i += 2)
        b.push_back(static_cast<uint8_t>(std::stoi(s.substr(i, 2), nullptr, 16)));
    return b;
}

// The test binary re-executed in one of the child modes; its stdout is read line by line.
class Child {
public:
    explicit Child(std::vector<std::string> args) {
        int out[2];
        if (pipe(out) != 0) return;
        args.insert(args.begin(), "/proc/self/exe");
        std::vector<char *> argv;
        for (auto &a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        pid_ = fork();
        if (pid_ == 0) {
            dup2(out[1], 1);
            close(out[0]);
            execv("/proc/self/exe", argv.data());
            _exit(127);
        }
        close(out[1]);
        fd_ = out[0];
    }
    ~Child() {
        kill_now();
        if (fd_ >= 0) close(fd_);
    }
    // The next line, or "" after `ms`.
    std::string line(int ms = 30000) {
        for (;;) {
            auto nl = buf_.find('\n');
            if (nl != std::string::npos) {
                std::string l = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                return l;
            }
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, ms) <= 0) return "";
            char c[4096];
            ssize_t n = read(fd_, c, sizeof c);
            if (n <= 0) return "";
            buf_.append(c, static_cast<size_t>(n));
        }
    }
    void kill_now() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
    }

private:
    pid_t pid_ = -1;
    int fd_ = -1;
    std::string buf_;
};

std::vector<std::string> child_args(const char *flag, const StagedParam &p) {
    std::vector<std::string> a = {flag, p.path};
    for (const auto &[k, v] : p.options) a.push_back(k + "=" + v);
    return a;
}

// The sockets this process holds. tcp.so and shm.so close a peer's connection only once none
// of its copies runs (so that its EOF means "nothing touches your memory"): the target is done
// with a dead peer when the connections it accepted from it are gone. (efa.so lands a peer's
// bytes only in buffers it granted, and so lent, before the peer died.)
std::set<std::string> sockets() {
    std::set<std::string> s;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
        std::error_code bad;
        std::string t = std::filesystem::read_symlink(e.path(), bad).string();
        if (!bad && t.rfind("socket:", 0) == 0) s.insert(t);
    }
    return s;
}

// Until every socket open now was open at `before`; false after `limit`.
bool wait_sockets_back_to(const std::set<std::string> &before, std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
        const std::set<std::string> now = sockets();
        if (std::includes(before.begin(), before.end(), now.begin(), now.end())) return true;
        if (std::chrono::steady_clock::now() > end) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polls the kernel's view
    }
}

class StagedDevice : public ::testing::TestWithParam<StagedParam> {
protected:
    void SetUp() override {
        plugin_ = std::make_unique<Plugin>(GetParam().path);
        if (!plugin_->ok()) GTEST_SKIP() << "SKIPPED: " << plugin_->error();
    }
    void TearDown() override {
        initiator_.reset();
        target_.reset();
        if (host_) {
            EXPECT_TRUE(host_->wait_idle(std::chrono::seconds(30))) << "staging buffers still lent";
            StagingStats s = host_->stats();
            EXPECT_EQ(s.held, 0u);
            EXPECT_EQ(s.acquired, s.released);
            for (const auto &m : s.misuse) ADD_FAILURE() << "staging misuse: " << m;
        }
    }

    // Target: device region of `dev_len` bytes on a staging host; initiator: host memory.
    void start(uint64_t max_bytes = 4 * kSlice, size_t dev_len = 8 * kMiB, const Options &target_extra = {}) {
        host_ = std::make_unique<StagingHost>(kSlice, max_bytes);
        if (!host_parts_) host_->offer_parts(false);
        dev_ = std::make_unique<DeviceMemory>(dev_len);
        host_->add_device(*dev_);
        local_ = std::make_unique<Buffer>(dev_len);
        Options to = GetParam().options;
        to.insert(to.end(), target_extra.begin(), target_extra.end());
        target_ = std::make_unique<Instance>(*plugin_, to, host_->api());
        ASSERT_EQ(target_->create_rc(), 0) << target_->last_error();
        ASSERT_EQ(
            target_->register_mem(reinterpret_cast<void *>(dev_->addr()), dev_len, kRW, &dev_mem_, FERRY_MEM_CUDA), 0)
            << target_->last_error();
        initiator_ = std::make_unique<Instance>(*plugin_, GetParam().options);
        ASSERT_EQ(initiator_->create_rc(), 0) << initiator_->last_error();
        ASSERT_EQ(initiator_->register_mem(local_->data(), dev_len, 0, &local_mem_), 0) << initiator_->last_error();
        ASSERT_EQ(initiator_->connect(target_->endpoint(), &peer_), 0) << initiator_->last_error();
        ASSERT_EQ(initiator_->import_mem(peer_, dev_->addr(), dev_len, kRW, &remote_, FERRY_MEM_CUDA), 0)
            << initiator_->last_error();
    }
    ferry_xfer_op_t op(uint32_t code, uint64_t off, uint64_t len, uint64_t ud) const {
        return make_op(code, local_->addr() + off, local_mem_, dev_->addr() + off, remote_, len, ud);
    }
    std::vector<ferry_completion_t> run(const std::vector<ferry_xfer_op_t> &ops) {
        EXPECT_EQ(initiator_->submit(peer_, ops), 0) << initiator_->last_error();
        auto got = initiator_->wait(ops.size());
        EXPECT_EQ(got.size(), ops.size()) << "ops hang";
        return got;
    }

    std::unique_ptr<Plugin> plugin_;
    std::unique_ptr<StagingHost> host_;
    std::unique_ptr<DeviceMemory> dev_;
    std::unique_ptr<Buffer> local_;
    std::unique_ptr<Instance> target_, initiator_;
    uint64_t dev_mem_ = 0, local_mem_ = 0, peer_ = 0, remote_ = 0;
    bool host_parts_ = true;  // the host offers stage_copy_parts (ABI 1.7)
};

TEST_P(StagedDevice, AdvertisesTheCap) { EXPECT_NE((*plugin_)->caps & FERRY_CAP_STAGED_DEVICE, 0u); }

// READ out of and WRITE into device memory, sub-ranges at odd offsets, ops of many slices.
TEST_P(StagedDevice, ReadAndWriteSubRangesByteExact) {
    ASSERT_NO_FATAL_FAILURE(start());
    fill_pattern(dev_->alias(), dev_->size(), 11);
    struct R {
        uint64_t off, len;
    };
    const R reads[] = {
        {0, 3 * kMiB + 4097}, {3 * kMiB + 4097, 1000}, {5 * kMiB + 1, 2 * kMiB + 12345}, {8 * kMiB - 7, 7}};
    std::vector<ferry_xfer_op_t> ops;
    for (size_t i = 0; i < std::size(reads); ++i) ops.push_back(op(FERRY_OP_READ, reads[i].off, reads[i].len, i));
    for (const auto &c : run(ops)) EXPECT_EQ(c.status, 0) << c.message;
    for (const R &r : reads)
        EXPECT_EQ(find_mismatch(local_->data() + r.off, r.len, 11, r.off), SIZE_MAX) << "READ at " << r.off;

    fill_pattern(local_->data(), local_->size(), 12);
    memset(dev_->alias(), 0, dev_->size());
    const R writes[] = {{1, 2 * kMiB + 3}, {2 * kMiB + 4, 64}, {4 * kMiB, 4 * kMiB - 100}};
    ops.clear();
    for (size_t i = 0; i < std::size(writes); ++i) ops.push_back(op(FERRY_OP_WRITE, writes[i].off, writes[i].len, i));
    for (const auto &c : run(ops))
        EXPECT_EQ(c.status, 0) << c.message;  // complete = in "device" memory (checked at once)
    for (const R &w : writes)
        EXPECT_EQ(find_mismatch(dev_->alias() + w.off, w.len, 12, w.off), SIZE_MAX) << "WRITE at " << w.off;
    EXPECT_EQ(dev_->alias()[0], 0);
    EXPECT_EQ(dev_->alias()[2 * kMiB + 68], 0);
}

// The host's bound holds one buffer: every other acquire gets -EAGAIN, and all ops still finish.
TEST_P(StagedDevice, BoundReachedStillCompletes) {
    ASSERT_NO_FATAL_FAILURE(start(kSlice));
    fill_pattern(dev_->alias(), 4 * kMiB, 21);
    fill_pattern(local_->data() + 4 * kMiB, 4 * kMiB, 22, 4 * kMiB);
    std::vector<ferry_xfer_op_t> ops;
    for (uint64_t i = 0; i < 4; ++i) {
        ops.push_back(op(FERRY_OP_READ, i * kMiB, kMiB, i));
        ops.push_back(op(FERRY_OP_WRITE, 4 * kMiB + i * kMiB, kMiB, 10 + i));
    }
    for (const auto &c : run(ops)) EXPECT_EQ(c.status, 0) << c.message;
    EXPECT_EQ(find_mismatch(local_->data(), 4 * kMiB, 21), SIZE_MAX);
    EXPECT_EQ(find_mismatch(dev_->alias() + 4 * kMiB, 4 * kMiB, 22, 4 * kMiB), SIZE_MAX);
    StagingStats s = host_->stats();
    EXPECT_GT(s.eagain, 0u) << "the bound was never reached";
    EXPECT_LE(s.peak_held_bytes, kSlice);
}

// No buffer at all (bound 0): the op fails at once, naming the engine option.
TEST_P(StagedDevice, NoBufferEverFailsNamingTheBound) {
    ASSERT_NO_FATAL_FAILURE(start(0));
    for (uint32_t code : {FERRY_OP_READ, FERRY_OP_WRITE}) {
        auto got = run({op(code, 0, kMiB, 1)});
        ASSERT_EQ(got.size(), 1u);
        EXPECT_EQ(got[0].status, -EAGAIN) << got[0].message;
        EXPECT_NE(strstr(got[0].message, "gpu_staging_max_bytes"), nullptr) << got[0].message;
    }
}

// A failed copy fails exactly its op, with the host's message; the next op on the same
// connection works; after a WRITE's failure is reported no byte lands in its range.
TEST_P(StagedDevice, CopyFailureFailsThatOpOnly) {
    ASSERT_NO_FATAL_FAILURE(start());
    fill_pattern(dev_->alias(), 2 * kMiB, 31);
    for (uint32_t code : {FERRY_OP_READ, FERRY_OP_WRITE}) {
        auto ok = run({op(code, 0, kMiB, 1)});
        ASSERT_EQ(ok.size(), 1u);
        EXPECT_EQ(ok[0].status, 0) << ok[0].message;

        std::atomic<bool> reported{false};
        std::atomic<int> late{0};
        host_->on_copy([&](bool to_device, uint64_t addr, uint64_t) {
            if (to_device && reported.load() && addr >= dev_->addr() + kMiB && addr < dev_->addr() + 2 * kMiB) ++late;
        });
        host_->fail_copy(1);
        ASSERT_EQ(initiator_->submit(peer_, {op(code, kMiB, kMiB, 2)}), 0) << initiator_->last_error();
        auto bad = initiator_->wait(1);
        reported = true;
        ASSERT_EQ(bad.size(), 1u) << "hangs";
        if (code == FERRY_OP_READ && GetParam().read_fails_connection) {
            EXPECT_LT(bad[0].status, 0);
            EXPECT_NE(strstr(bad[0].message, "closed the connection"), nullptr) << bad[0].message;
        } else {
            EXPECT_EQ(bad[0].status, -EIO) << bad[0].message;
            EXPECT_NE(strstr(bad[0].message, StagingHost::kFailText), nullptr) << bad[0].message;
        }
        ASSERT_TRUE(host_->wait_idle(std::chrono::seconds(30)));
        EXPECT_EQ(late.load(), 0) << "bytes were copied into the device after the WRITE was reported failed";
        host_->on_copy(nullptr);

        auto after = run({op(code, 0, 2 * kMiB, 3)});
        ASSERT_EQ(after.size(), 1u);
        EXPECT_EQ(after[0].status, 0) << after[0].message;
    }
}

// A host older than ABI 1.1 (or one without staging) gets device memory refused, clearly.
TEST_P(StagedDevice, OldHostRefusesDeviceRegions) {
    DeviceMemory dev(kMiB);
    ferry_host_api_t old = *test_host();
    old.struct_size = FERRY_HOST_API_SIZE_UNTIL(log_level);
    Instance a(*plugin_, GetParam().options, &old);
    ASSERT_EQ(a.create_rc(), 0) << a.last_error();
    uint64_t h = 0;
    EXPECT_EQ(a.register_mem(reinterpret_cast<void *>(dev.addr()), kMiB, kRW, &h, FERRY_MEM_CUDA), -ENOTSUP);
    EXPECT_NE(a.last_error().find("older than plugin ABI 1.1"), std::string::npos) << a.last_error();
    Buffer b(kMiB);
    EXPECT_EQ(a.register_mem(b.data(), kMiB, kRW, &h), 0) << "host memory still registers";

    ferry_host_api_t none = *test_host();  // ABI 1.1 size, stage_* NULL
    Instance c(*plugin_, GetParam().options, &none);
    ASSERT_EQ(c.create_rc(), 0) << c.last_error();
    EXPECT_EQ(c.register_mem(reinterpret_cast<void *>(dev.addr()), kMiB, kRW, &h, FERRY_MEM_ROCM), -ENOTSUP);
    EXPECT_NE(c.last_error().find("offers no staging"), std::string::npos) << c.last_error();
}

// The plugin serves device regions; as an initiator it refuses them (the core stages those).
TEST_P(StagedDevice, LocalDeviceRegionIsRefusedAsInitiator) {
    ASSERT_NO_FATAL_FAILURE(start());
    Instance a(*plugin_, GetParam().options, host_->api());
    ASSERT_EQ(a.create_rc(), 0) << a.last_error();
    uint64_t mine = 0, peer = 0, remote = 0;
    ASSERT_EQ(a.register_mem(reinterpret_cast<void *>(dev_->addr()), kMiB, 0, &mine, FERRY_MEM_CUDA), 0);
    ASSERT_EQ(a.connect(target_->endpoint(), &peer), 0) << a.last_error();
    ASSERT_EQ(a.import_mem(peer, dev_->addr(), dev_->size(), kRW, &remote, FERRY_MEM_CUDA), 0);
    auto o = make_op(FERRY_OP_READ, dev_->addr(), mine, dev_->addr() + kMiB, remote, 4096, 1);
    EXPECT_EQ(a.submit(peer, {o}), -ENOTSUP);
    EXPECT_NE(a.last_error().find("device memory"), std::string::npos) << a.last_error();
}

// The initiator dies while its ops are in the target's pipeline: every buffer comes back, the
// target keeps serving.
TEST_P(StagedDevice, InitiatorKilledMidPipelineReturnsEveryBuffer) {
    ASSERT_NO_FATAL_FAILURE(start());
    const std::set<std::string> before = sockets();  // the child's connections come after these
    host_->set_copy_delay(std::chrono::milliseconds(20));
    host_->set_release_delay(std::chrono::milliseconds(30));  // wide gaps between slices
    auto args = child_args(kInitiatorFlag, GetParam());
    args.insert(args.begin() + 2,
                {hex(target_->endpoint()), std::to_string(dev_->addr()), std::to_string(dev_->size())});
    Child child(args);
    ASSERT_EQ(child.line(), "SUBMITTED");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (host_->stats().copies < 3 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_GE(host_->stats().copies, 3u);
    ASSERT_GT(host_->stats().held, 0u) << "not mid-pipeline";
    child.kill_now();
    // Nothing lent can be a gap between two slices while the dead peer's WRITE payload, sent
    // before the kill, still waits in the target's socket: the target is done with the peer
    // once it closed the peer's connections, which it does only when none of its copies runs.
    EXPECT_TRUE(wait_sockets_back_to(before, std::chrono::seconds(60)))
        << "the target kept the dead initiator's connections";
    EXPECT_TRUE(host_->wait_idle(std::chrono::seconds(60))) << "buffers not returned after the peer died";
    auto late = std::make_shared<std::atomic<int>>(0);
    host_->on_copy([late](bool to_device, uint64_t, uint64_t) { late->fetch_add(to_device ? 1 : 0); });
    host_->set_copy_delay(std::chrono::milliseconds(0));
    host_->set_release_delay(std::chrono::milliseconds(0));
    fill_pattern(dev_->alias(), kMiB, 41);
    auto got = run({op(FERRY_OP_READ, 0, kMiB, 1)});
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].status, 0) << got[0].message;
    EXPECT_EQ(find_mismatch(local_->data(), kMiB, 41), SIZE_MAX);
    EXPECT_EQ(late->load(), 0) << "the dead initiator's WRITE reached device memory after the target was done with it";
}

// The target is destroyed while it still copies for an initiator that died: a copy ending
// meanwhile must not reach a deleted connection (tcp.so: dispose_all, then the kick).
TEST_P(StagedDevice, TargetDestroyedWhileCopyingForADeadInitiator) {
    // tcp.so: the dead peer's connections on one reactor, so that one's teardown (slow releases)
    // runs while copies of the other end.
    Options one_reactor;
    if (GetParam().name.rfind("tcp", 0) == 0) one_reactor.push_back({"io_threads", "1"});
    for (int round = 0; round < 4; ++round) {
        ASSERT_NO_FATAL_FAILURE(start(4 * kSlice, 8 * kMiB, one_reactor));
        host_->set_copy_delay(std::chrono::milliseconds(5));
        host_->set_release_delay(std::chrono::milliseconds(10));  // slow teardowns: copies end meanwhile
        auto args = child_args(kInitiatorFlag, GetParam());
        args.insert(args.begin() + 2,
                    {hex(target_->endpoint()), std::to_string(dev_->addr()), std::to_string(dev_->size())});
        Child child(args);
        ASSERT_EQ(child.line(), "SUBMITTED");
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (host_->stats().copies < 3 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        child.kill_now();
        initiator_.reset();
        target_.reset();  // copies for the dead peer still queued
        host_->set_release_delay(std::chrono::milliseconds(0));
        ASSERT_TRUE(host_->wait_idle(std::chrono::seconds(60))) << "buffers not returned by the destroyed target";
        StagingStats st = host_->stats();
        EXPECT_EQ(st.acquired, st.released);
        for (const auto &m : st.misuse) ADD_FAILURE() << "staging misuse: " << m;
    }
}

// The target dies mid-pipeline: every op fails with an error, none hangs.
TEST_P(StagedDevice, TargetKilledMidPipelineFailsEveryOp) {
    Child child(child_args(kTargetFlag, GetParam()));
    std::string ready = child.line();
    ASSERT_EQ(ready.rfind("READY ", 0), 0u) << ready;
    char ep[512];
    unsigned long long addr = 0, len = 0;
    ASSERT_EQ(sscanf(ready.c_str(), "READY %511s %llu %llu", ep, &addr, &len), 3);
    Instance ini(*plugin_, GetParam().options);
    Buffer local(len);
    uint64_t lm = 0, peer = 0, remote = 0;
    ASSERT_EQ(ini.register_mem(local.data(), len, 0, &lm), 0);
    ASSERT_EQ(ini.connect(unhex(ep), &peer), 0) << ini.last_error();
    ASSERT_EQ(ini.import_mem(peer, addr, len, kRW, &remote, FERRY_MEM_CUDA), 0);
    std::vector<ferry_xfer_op_t> ops;
    for (uint64_t i = 0; i < 8; ++i)
        ops.push_back(make_op(i % 2 ? FERRY_OP_WRITE : FERRY_OP_READ, local.addr() + i * kMiB, lm, addr + i * kMiB,
                              remote, kMiB, i));
    ASSERT_EQ(ini.submit(peer, ops), 0) << ini.last_error();
    ASSERT_EQ(child.line(), "COPYING");  // the child saw its first copies start
    child.kill_now();
    auto got = ini.wait(ops.size(), std::chrono::seconds(120));
    ASSERT_EQ(got.size(), ops.size()) << "ops hang after the target died";
    size_t failed = 0;
    for (const auto &c : got)
        if (c.status != 0) {
            ++failed;
            EXPECT_LT(c.status, 0);
            EXPECT_NE(c.message[0], '\0');
        }
    EXPECT_GT(failed, 0u) << "the kill came after the pipeline";
}

// tcp.so packs small READs and WRITEs of device memory that arrive together into shared staging
// buffers (one stage_copy_parts each); the other plugins copy per request or per piece.
class StagedPacking : public StagedDevice {
protected:
    void SetUp() override {
        StagedDevice::SetUp();
        if (!IsSkipped() && GetParam().name.rfind("tcp", 0) != 0)
            GTEST_SKIP() << "SKIPPED: packing small requests into shared staging buffers is tcp.so's ("
                         << GetParam().name << " copies each request on its own)";
    }
    // Ops of 1 B to 64 KiB + 1 at odd offsets, back to back with gaps; the ones over a quarter
    // of the test host's buffer (64 KiB) go alone.
    std::vector<ferry_xfer_op_t> small_ops(uint32_t code, size_t n, uint64_t *bytes) const {
        static constexpr uint64_t kLens[] = {1, 3, 4097, 16384, 16389, 65536, 65537, 777};
        std::vector<ferry_xfer_op_t> ops;
        uint64_t off = 5;
        *bytes = 0;
        for (size_t i = 0; i < n; ++i) {
            const uint64_t len = kLens[i % std::size(kLens)];
            if (off + len > dev_->size()) off = 5 + i % 13;
            ops.push_back(op(code, off, len, i));
            *bytes += len;
            off += len + 17;
        }
        return ops;
    }
    // Every op reported once; the successful ones byte-exact where they landed (READ: local
    // memory, WRITE: device memory), and no failed WRITE's byte in device memory. Returns how
    // many failed.
    size_t check(const std::vector<ferry_xfer_op_t> &ops, const std::vector<ferry_completion_t> &got, uint64_t seed) {
        EXPECT_EQ(got.size(), ops.size());
        std::vector<int> seen(ops.size(), 0);
        size_t failed = 0;
        for (const auto &c : got) {
            if (c.user_data >= ops.size() || seen[c.user_data]++ != 0) {
                ADD_FAILURE() << "op " << c.user_data << " reported twice or unknown";
                continue;
            }
            const ferry_xfer_op_t &o = ops[c.user_data];
            const uint64_t off = o.remote_addr - dev_->addr();
            const bool read = o.opcode == FERRY_OP_READ;
            const uint8_t *landed = (read ? local_->data() : dev_->alias()) + off;
            if (c.status != 0) {
                ++failed;
                EXPECT_EQ(c.status, -EIO) << c.message;
                EXPECT_NE(strstr(c.message, StagingHost::kFailText), nullptr) << c.message;
                if (!read)
                    EXPECT_TRUE(std::all_of(landed, landed + o.length, [](uint8_t b) { return b == 0; }))
                        << "a failed WRITE's bytes reached device memory";
                continue;
            }
            EXPECT_EQ(find_mismatch(landed, o.length, seed, off), SIZE_MAX)
                << (read ? "READ " : "WRITE ") << c.user_data << " of " << o.length << " bytes at " << off;
        }
        return failed;
    }
};

// 600 small READs, then 600 small WRITEs, in one submit each: each byte-exact, far fewer buffers
// and copies than requests.
TEST_P(StagedPacking, SmallOpsShareStagingBuffersByteExact) {
    for (uint32_t code : {FERRY_OP_READ, FERRY_OP_WRITE}) {
        SCOPED_TRACE(code == FERRY_OP_READ ? "READ" : "WRITE");
        ASSERT_NO_FATAL_FAILURE(start());
        if (code == FERRY_OP_READ) fill_pattern(dev_->alias(), dev_->size(), 51);
        else fill_pattern(local_->data(), local_->size(), 51), memset(dev_->alias(), 0, dev_->size());
        host_->set_copy_delay(std::chrono::milliseconds(2));  // later requests queue behind the window
        uint64_t bytes = 0;
        auto ops = small_ops(code, 600, &bytes);
        EXPECT_EQ(check(ops, run(ops), 51), 0u);
        StagingStats st = host_->stats();
        EXPECT_GT(st.part_copies, 0u) << "nothing was packed";
        EXPECT_GE(st.parts, 2 * st.part_copies);
        EXPECT_LT(st.acquired, ops.size() / 3) << "a buffer per request: " << st.acquired << " for " << ops.size();
        EXPECT_LT(st.copies, ops.size() / 3);
        if (code == FERRY_OP_WRITE) {  // the gaps between the WRITEs stay untouched
            std::vector<bool> written(dev_->size());
            for (const auto &o : ops)
                for (uint64_t i = 0; i < o.length; ++i) written[o.remote_addr - dev_->addr() + i] = true;
            for (size_t i = 0; i < dev_->size(); ++i)
                if (!written[i] && dev_->alias()[i] != 0) {
                    ADD_FAILURE() << "byte " << i << " between WRITEs was written";
                    break;
                }
        }
        initiator_.reset();
        target_.reset();
        ASSERT_TRUE(host_->wait_idle(std::chrono::seconds(30)));
    }
}

// Packing off (staged_pack_max_bytes=0), or a host without stage_copy_parts (ABI 1.6): a
// buffer and a copy per request, as exact.
TEST_P(StagedPacking, PackingOffOrAnOlderHostCopiesEachRequest) {
    for (bool old_host : {false, true}) {
        SCOPED_TRACE(old_host ? "host without stage_copy_parts" : "staged_pack_max_bytes=0");
        host_parts_ = !old_host;
        ASSERT_NO_FATAL_FAILURE(old_host ? start() : start(4 * kSlice, 8 * kMiB, {{"staged_pack_max_bytes", "0"}}));
        fill_pattern(dev_->alias(), dev_->size(), 52);
        fill_pattern(local_->data(), local_->size(), 52);
        host_->set_copy_delay(std::chrono::milliseconds(1));
        uint64_t bytes = 0;
        auto ops = small_ops(FERRY_OP_READ, 96, &bytes);
        auto writes = small_ops(FERRY_OP_WRITE, 96, &bytes);
        ops.insert(ops.end(), writes.begin(), writes.end());
        for (size_t i = 0; i < ops.size(); ++i) ops[i].user_data = i;
        EXPECT_EQ(check(ops, run(ops), 52), 0u);
        StagingStats st = host_->stats();
        EXPECT_EQ(st.part_copies, 0u);
        EXPECT_EQ(st.copies, ops.size());
        initiator_.reset();
        target_.reset();
        ASSERT_TRUE(host_->wait_idle(std::chrono::seconds(30)));
    }
}

// A packed copy that fails fails exactly the requests of its buffer, each with the host's
// message and none twice (a failed WRITE lands nothing); every other op is exact, and the
// connection keeps serving.
TEST_P(StagedPacking, FailedPackedCopyFailsItsRequestsOnly) {
    ASSERT_NO_FATAL_FAILURE(start());
    fill_pattern(dev_->alias(), dev_->size(), 53);
    host_->set_copy_delay(std::chrono::milliseconds(2));
    fill_pattern(local_->data(), local_->size(), 53);
    for (uint32_t code : {FERRY_OP_READ, FERRY_OP_WRITE}) {
        SCOPED_TRACE(code == FERRY_OP_READ ? "READ" : "WRITE");
        if (code == FERRY_OP_WRITE) memset(dev_->alias(), 0, dev_->size());
        uint64_t bytes = 0;
        auto ops = small_ops(code, 400, &bytes);
        for (auto &o : ops) o.length = std::min<uint64_t>(o.length, 16384);  // all packable
        const StagingStats before = host_->stats();
        host_->fail_copy(3);  // the window's 4th buffer: requests queued behind the first copies
        const size_t failed = check(ops, run(ops), 53);
        StagingStats st = host_->stats();
        EXPECT_EQ(st.failed_copies - before.failed_copies, 1u);
        EXPECT_GE(failed, 1u);
        EXPECT_LT(failed, ops.size() / 2) << "more failed than one buffer's requests";
        EXPECT_GT(st.part_copies, before.part_copies);
    }
    host_->set_copy_delay(std::chrono::milliseconds(0));
    auto again = run({op(FERRY_OP_READ, 0, 4096, 1), op(FERRY_OP_WRITE, 8192, 4096, 2)});
    for (const auto &c : again) EXPECT_EQ(c.status, 0) << c.message;
}

// The initiator dies while packed copies run; the target, destroyed then, gives every buffer
// back once, each after its copy ended (the test host records a release during a copy).
TEST_P(StagedPacking, TargetDestroyedWhilePackedCopiesRun) {
    ASSERT_NO_FATAL_FAILURE(start());
    host_->set_copy_delay(std::chrono::milliseconds(20));
    uint64_t bytes = 0;
    auto ops = small_ops(FERRY_OP_READ, 300, &bytes);
    auto writes = small_ops(FERRY_OP_WRITE, 300, &bytes);
    ops.insert(ops.end(), writes.begin(), writes.end());
    ASSERT_EQ(initiator_->submit(peer_, ops), 0) << initiator_->last_error();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (host_->stats().part_copies < 1 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_GT(host_->stats().part_copies, 0u);
    initiator_.reset();
    target_.reset();
    ASSERT_TRUE(host_->wait_idle(std::chrono::seconds(60))) << "buffers not returned";
}

INSTANTIATE_TEST_SUITE_P(Plugins, StagedPacking, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<StagedParam> &i) { return i.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StagedPacking);

INSTANTIATE_TEST_SUITE_P(Plugins, StagedDevice, ::testing::ValuesIn(params()),
                         [](const auto &info) { return info.param.name; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StagedDevice);

Options parse_options(int argc, char **argv, int from) {
    Options o;
    for (int i = from; i < argc; ++i) {
        std::string kv = argv[i];
        auto eq = kv.find('=');
        o.push_back({kv.substr(0, eq), kv.substr(eq + 1)});
    }
    return o;
}

// argv: self --staged-initiator <plugin> <endpoint hex> <addr> <len> [k=v]...: submits READs and
// WRITEs of the target's whole device region, says SUBMITTED, and waits to be killed.
int initiator_main(int argc, char **argv) {
    Plugin p(argv[2]);
    if (!p.ok()) return 2;
    Instance ini(p, parse_options(argc, argv, 6));
    const uint64_t addr = std::stoull(argv[4]), len = std::stoull(argv[5]);
    Buffer local(len);
    uint64_t lm = 0, peer = 0, remote = 0;
    if (ini.register_mem(local.data(), len, 0, &lm) != 0 || ini.connect(unhex(argv[3]), &peer) != 0 ||
        ini.import_mem(peer, addr, len, kRW, &remote, FERRY_MEM_CUDA) != 0)
        return 3;
    std::vector<ferry_xfer_op_t> ops;
    for (uint64_t off = 0; off + kMiB <= len; off += kMiB)
        for (uint32_t code : {FERRY_OP_READ, FERRY_OP_WRITE})
            ops.push_back(make_op(code, local.addr() + off, lm, addr + off, remote, kMiB, off + code));
    if (ini.submit(peer, ops) != 0) return 4;
    printf("SUBMITTED\n");
    fflush(stdout);
    pause();
    return 0;
}

// argv: self --staged-target <plugin> [k=v]...: serves an 8 MiB device region with slow copies,
// says READY <endpoint hex> <addr> <len>, then COPYING once copies run, and waits to be killed.
int target_main(int argc, char **argv) {
    Plugin p(argv[2]);
    if (!p.ok()) return 2;
    StagingHost host(kSlice, 4 * kSlice);
    DeviceMemory dev(8 * kMiB);
    host.add_device(dev);
    host.set_copy_delay(std::chrono::milliseconds(50));
    std::atomic<bool> said{false};
    host.on_copy([&](bool, uint64_t, uint64_t) {
        if (!said.exchange(true)) {
            printf("COPYING\n");
            fflush(stdout);
        }
    });
    Instance t(p, parse_options(argc, argv, 3), host.api());
    uint64_t h = 0;
    if (t.create_rc() != 0 ||
        t.register_mem(reinterpret_cast<void *>(dev.addr()), dev.size(), kRW, &h, FERRY_MEM_CUDA) != 0)
        return 3;
    printf("READY %s %llu %llu\n", hex(t.endpoint()).c_str(), static_cast<unsigned long long>(dev.addr()),
           static_cast<unsigned long long>(dev.size()));
    fflush(stdout);
    pause();
    return 0;
}

}  // namespace
}  // namespace ferry_test

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], ferry_test::kInitiatorFlag) == 0) return ferry_test::initiator_main(argc, argv);
    if (argc > 2 && strcmp(argv[1], ferry_test::kTargetFlag) == 0) return ferry_test::target_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
