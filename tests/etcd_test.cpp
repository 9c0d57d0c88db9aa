// The etcd metadata backend against a real etcd server (Debian's etcd-server) that each test
// starts on loopback, and engines in child processes: publish and fetch, a crashed engine's
// segment leaving after its lease, a restarted peer re-read through the watch, an etcd restart
// that loses every lease, and an engine that starts before etcd does.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"
#include "test_util.hpp"

using namespace ferry;
using ferry::test::PeerProcess;
using Clock = std::chrono::steady_clock;

namespace {

// Joins a thread when the test returns, an assertion's early return included (a joinable
// std::thread destroyed terminates the process), after setting `stop` where one is given.
struct JoinOnExit {
    std::thread &thread;
    std::atomic<bool> *stop = nullptr;
    ~JoinOnExit() {
        if (stop) *stop = true;
        if (thread.joinable()) thread.join();
    }
};

uint16_t free_port() {
    static uint16_t next = static_cast<uint16_t>(23000 + (getpid() % 2000) * 4);
    next += 2;
    return next;
}

// One etcd server on 127.0.0.1, in a directory of its own.
class EtcdServer {
public:
    EtcdServer() : client_port_(free_port()), peer_port_(client_port_ + 1) {}
    ~EtcdServer() { stop(); }

    std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }

    bool start(bool wipe = false) {
        if (wipe) std::filesystem::remove_all(dir_ / "data");
        // Everything the child needs is made before fork: a child of a multithreaded process
        // may only make async-signal-safe calls until exec.
        const std::string client = "http://" + endpoint();
        const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
        const std::string cluster = "default=" + peer;
        const std::string data = (dir_ / "data").string();
        const int log = open((dir_ / "etcd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        pid_ = fork();
        if (pid_ == 0) {
            if (log >= 0) {
                dup2(log, 1);
                dup2(log, 2);
            }
            execl(FERRY_ETCD_BIN, "etcd", "--data-dir", data.c_str(), "--listen-client-urls", client.c_str(),
                  "--advertise-client-urls", client.c_str(), "--listen-peer-urls", peer.c_str(),
                  "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster", cluster.c_str(),
                  static_cast<char *>(nullptr));
            _exit(127);
        }
        if (log >= 0) close(log);
        // Ready once it answers on its client port.
        auto deadline = Clock::now() + std::chrono::seconds(20);
        while (Clock::now() < deadline) {
            int status;
            if (ferry::test::run_command(
                    "curl -s -m 1 -X POST http://" + endpoint() + "/v3/maintenance/status -d '{}' >/dev/null", &status),
                status == 0)
                return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return false;
    }
    void stop() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
    }

private:
    uint16_t client_port_, peer_port_;
    ferry::test::TempDir dir_;
    pid_t pid_ = -1;
};

class EtcdTest : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_TRUE(etcd.start()) << "etcd did not start on " << etcd.endpoint();
        url = "etcd://" + etcd.endpoint() + "/ferry-test-" + std::to_string(getpid());
    }
    // A 2 s lease, so a crashed peer's segment leaves within the test; the tests that publish
    // thousands of regions take 10 s, since on a loaded machine under a sanitizer a keep-alive
    // can come later than 2 s after the last while etcd applies their transactions, and then
    // the segment would leave etcd for a moment under a reader that is checking it.
    Config config(const std::string &name, const char *lease_ttl_s = "2") {
        return {{"plugins", "tcp"}, {"metadata", url}, {"local_server_name", name}, {"etcd_lease_ttl_s", lease_ttl_s}};
    }
    std::vector<std::string> peer_args(const std::string &name) {
        return {"--size",   "1048576",           "--option", "metadata=" + url, "--option", "local_server_name=" + name,
                "--option", "etcd_lease_ttl_s=2"};
    }
    // Waits (bounded) until `open_segment(name)` gives the expected kind of answer.
    static bool eventually(const std::function<bool()> &check, std::chrono::seconds limit = std::chrono::seconds(15)) {
        auto deadline = Clock::now() + limit;
        while (Clock::now() < deadline) {
            if (check()) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        return false;
    }
    static Result<void> read_all(Engine &e, SegmentId seg, uint64_t remote, std::vector<uint8_t> &local) {
        std::vector<Request> r = {{Opcode::Read, local.data(), seg, remote, local.size(), ""}};
        auto b = e.submit(r);
        if (!b) return std::unexpected(b.error());
        auto w = e.wait(*b, std::chrono::seconds(20));
        (void)e.free_batch(*b);
        return w;
    }

    EtcdServer etcd;
    std::string url;
};

}  // namespace

TEST_F(EtcdTest, SegmentsArePublishedAndFetchedThroughEtcd) {
    PeerProcess peer(peer_args("node-a"));
    ASSERT_TRUE(peer.ok) << peer.error;
    EXPECT_EQ(peer.segment, "node-a");
    auto engine = Engine::create(config("node-b"));
    ASSERT_TRUE(engine) << engine.error().message;
    auto seg = (*engine)->open_segment("node-a");
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<uint8_t> local(peer.size);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto r = read_all(**engine, *seg, peer.base, local);
    ASSERT_TRUE(r) << r.error().message;
    for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i));

    auto missing = (*engine)->open_segment("node-nobody");
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code, -ENOENT);
    EXPECT_NE(missing.error().message.find("is not registered in etcd"), std::string::npos) << missing.error().message;
}

TEST_F(EtcdTest, ACrashedEnginesSegmentLeavesAfterItsLease) {
    auto engine = Engine::create(config("observer"));
    ASSERT_TRUE(engine) << engine.error().message;
    {
        PeerProcess doomed(peer_args("doomed"));
        ASSERT_TRUE(doomed.ok) << doomed.error;
        ASSERT_TRUE((*engine)->open_segment("doomed"));
        doomed.kill_now();  // no clean shutdown: only the lease can remove it
    }
    ASSERT_TRUE((*engine)->close_segment(*(*engine)->open_segment("doomed")));
    auto start = Clock::now();
    EXPECT_TRUE(eventually([&] {
        auto s = (*engine)->open_segment("doomed");
        if (s) (void)(*engine)->close_segment(*s);  // still there: forget it and ask etcd again
        return !s;
    })) << "the dead engine's segment is still in etcd long after its 2 s lease";
    std::cout << "segment gone after " << std::chrono::duration<double>(Clock::now() - start).count() << " s\n";
}

TEST_F(EtcdTest, ARestartedPeerIsReReadThroughTheWatch) {
    auto engine = Engine::create(config("reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    std::vector<uint8_t> local(1 << 20);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto first = std::make_unique<PeerProcess>(peer_args("phoenix"));
    ASSERT_TRUE(first->ok) << first->error;
    auto seg = (*engine)->open_segment("phoenix");
    ASSERT_TRUE(seg);
    ASSERT_TRUE(read_all(**engine, *seg, first->base, local));
    first->kill_now();
    // The same name comes back from a new process: new tcp port, new buffer address.
    PeerProcess second(peer_args("phoenix"));
    ASSERT_TRUE(second.ok) << second.error;
    std::fill(local.begin(), local.end(), 0);
    bool ok = eventually([&] { return static_cast<bool>(read_all(**engine, *seg, second.base, local)); });
    ASSERT_TRUE(ok) << "ops to the restarted peer never succeeded";
    for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i));
}

TEST_F(EtcdTest, EnginesRegisterAgainAfterEtcdRestartsWithoutItsData) {
    PeerProcess peer(peer_args("survivor"));
    ASSERT_TRUE(peer.ok) << peer.error;
    etcd.stop();
    ASSERT_TRUE(etcd.start(/*wipe=*/true));  // every lease and key is gone
    auto engine = Engine::create(config("late-reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    bool back = eventually([&] { return static_cast<bool>((*engine)->open_segment("survivor")); });
    ASSERT_TRUE(back) << "the peer never registered again in the restarted etcd";
    std::vector<uint8_t> local(peer.size);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto r = read_all(**engine, *(*engine)->open_segment("survivor"), peer.base, local);
    ASSERT_TRUE(r) << r.error().message;
}

TEST_F(EtcdTest, AnEngineStartedBeforeEtcdRetriesUntilItAnswers) {
    etcd.stop();
    std::thread later([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        etcd.start();
    });
    auto start = Clock::now();
    auto c = config("early-bird");
    c["metadata_retry_ms"] = "30000";
    auto engine = Engine::create(c);
    later.join();
    ASSERT_TRUE(engine) << engine.error().message;
    EXPECT_GT(Clock::now() - start, std::chrono::milliseconds(1000)) << "it cannot have registered before etcd ran";

    etcd.stop();
    c["metadata_retry_ms"] = "500";
    auto gives_up = Engine::create(c);
    ASSERT_FALSE(gives_up);
    EXPECT_NE(gives_up.error().message.find("cannot reach etcd"), std::string::npos) << gives_up.error().message;
}

// With etcd metadata the segment name is not an address: notifications find the peer's
// control server through the address its descriptor publishes.
TEST_F(EtcdTest, NotificationsReachPeersFoundThroughEtcd) {
    PeerProcess peer(peer_args("node-notified"));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = Engine::create(config("node-notifier"));
    ASSERT_TRUE(engine) << engine.error().message;
    auto seg = (*engine)->open_segment("node-notified");
    ASSERT_TRUE(seg) << seg.error().message;
    std::string text = "over etcd";
    auto sent = (*engine)->send_notification(*seg, {reinterpret_cast<const uint8_t *>(text.data()), 4});
    ASSERT_TRUE(sent) << sent.error().message;
    EXPECT_EQ(peer.command("take"), "TAKEN 1 node-notifier|over");
    ASSERT_EQ(peer.command("notify node-notifier back"), "OK");
    auto notes = (*engine)->take_notifications();
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(notes[0].from, "node-notified");
    EXPECT_EQ(std::string(notes[0].message.begin(), notes[0].message.end()), "back");
}

// Past the old limit: a whole descriptor of 25k regions (~2 MB) did not fit etcd's 1.5 MiB
// request; in chunks it registers (one batch, one transaction per ~100 chunks), opens and
// resolves its first, middle and last regions.
TEST_F(EtcdTest, TwentyFiveThousandRegionsPublishInChunksAndResolve) {
    auto target = Engine::create(config("many", "10")), initiator = Engine::create(config("reader", "10"));
    ASSERT_TRUE(target && initiator) << (!target ? target.error() : initiator.error()).message;
    constexpr size_t kRegions = 25000, kSize = 64;
    std::vector<uint8_t> remote(kRegions * kSize), local(kSize);
    for (size_t i = 0; i < remote.size(); ++i) remote[i] = static_cast<uint8_t>(i * 7 + 3);
    std::vector<MemoryRange> ranges;
    for (size_t i = 0; i < kRegions; ++i) ranges.push_back({remote.data() + i * kSize, kSize});
    ASSERT_TRUE((*target)->register_memory_batch(ranges));
    ASSERT_TRUE((*initiator)->register_memory(local.data(), local.size()));
    auto seg = (*initiator)->open_segment("many");
    ASSERT_TRUE(seg) << seg.error().message;
    auto regions = (*initiator)->segment_regions(*seg);
    ASSERT_TRUE(regions) << regions.error().message;
    ASSERT_EQ(regions->size(), kRegions);
    for (size_t i : {size_t{0}, kRegions / 2, kRegions - 1}) {
        uint64_t addr = reinterpret_cast<uintptr_t>(remote.data()) + i * kSize;
        ASSERT_TRUE(read_all(**initiator, *seg, addr, local));
        EXPECT_EQ(memcmp(local.data(), remote.data() + i * kSize, kSize), 0) << "region " << i;
    }
    // One more, registered singly after the open, is found by the re-fetch on a miss.
    std::vector<uint8_t> extra(kSize, 0x5a);
    ASSERT_TRUE((*target)->register_memory(extra.data(), extra.size()));
    ASSERT_TRUE(read_all(**initiator, *seg, reinterpret_cast<uintptr_t>(extra.data()), local));
    EXPECT_EQ(local, extra);
}

template <class... Args>
std::string cat(Args &&...args) {
    std::ostringstream out;
    (out << ... << args);
    return out.str();
}

// A reader racing a writer that registers regions 0..N-1 in order and then unregisters them in
// order: every fetch is some whole state (a contiguous run [lo, hi) of regions, never a torn
// mix of chunks), and never older than what had returned before the fetch began.
TEST_F(EtcdTest, AReaderRacingRegistersAndUnregistersNeverSeesATornOrStaleDescriptor) {
    auto writer = Engine::create(config("writer", "10")), reader = Engine::create(config("racer", "10"));
    ASSERT_TRUE(writer && reader) << (!writer ? writer.error() : reader.error()).message;
    constexpr size_t kRegions = 400, kSize = 64;  // ~13 chunks: splits while growing, empties while shrinking
    std::vector<uint8_t> buf(kRegions * kSize);
    const uint64_t base = reinterpret_cast<uintptr_t>(buf.data());
    std::atomic<size_t> registered{0}, unregistered{0};
    std::atomic<bool> done{false};
    std::thread w([&] {
        for (size_t i = 0; i < kRegions; ++i) {
            if (!(*writer)->register_memory(buf.data() + i * kSize, kSize)) break;
            registered = i + 1;
        }
        for (size_t i = 0; i < kRegions; ++i) {
            if (!(*writer)->unregister_memory(buf.data() + i * kSize)) break;
            unregistered = i + 1;
        }
        done = true;
    });
    JoinOnExit joiner{w};
    auto seg = (*reader)->open_segment("writer");
    ASSERT_TRUE(seg) << seg.error().message;
    size_t fetches = 0, nonempty = 0;
    std::string problem;
    while (!done && problem.empty()) {
        size_t r0 = registered, u0 = unregistered;
        auto regions = (*reader)->segment_regions(*seg);
        size_t r1 = registered, u1 = unregistered;
        ++fetches;
        if (!regions) {
            problem = "fetch failed: " + regions.error().message;
            break;
        }
        if (regions->empty()) {
            if (r0 > 0 && u1 + 1 < kRegions)
                problem = cat("empty after ", r0, " registers and only ", u1, " unregisters");
            continue;
        }
        ++nonempty;
        size_t lo = ((*regions)[0].addr - base) / kSize, hi = lo + regions->size();
        for (size_t k = 0; k < regions->size() && problem.empty(); ++k)
            if ((*regions)[k].addr != base + (lo + k) * kSize || (*regions)[k].length != kSize)
                problem = cat("torn: region ", k, " of the fetch is not region ", lo + k);
        if (problem.empty() && (hi < r0 || lo < u0))
            problem = cat("stale: [", lo, ", ", hi, ") after ", r0, " registers and ", u0, " unregisters returned");
        if (problem.empty() && (hi > r1 + 1 || lo > u1 + 1))
            problem = cat("from the future: [", lo, ", ", hi, ") with ", r1, " registered and ", u1, " unregistered");
    }
    done = true;
    w.join();
    EXPECT_TRUE(problem.empty()) << problem << " (after " << fetches << " fetches)";
    EXPECT_EQ(unregistered.load(), kRegions) << "the writer failed";
    EXPECT_GT(nonempty, 0u) << "the reader never caught the writer mid-way; the race was not exercised";
}

namespace {

// etcd's revision: it moves with every write to the store.
int64_t store_revision(const std::string &endpoint) {
    int status;
    auto out = ferry::test::run_command(
        "curl -s -m 5 -X POST http://" + endpoint + "/v3/kv/range -d '{\"key\":\"AA==\",\"count_only\":true}'",
        &status);
    auto at = out.find("\"revision\":\"");
    return status == 0 && at != std::string::npos ? std::atoll(out.c_str() + at + 12) : -1;
}

}  // namespace

// 100k regions in one register_memory_batch (~800 chunks, transactions of at most ~100), then
// one unregister_memory_batch, with a reader fetching all the while: every fetch resolves, and
// shows the regions of a whole prefix of the batch (a suffix while unregistering), in order,
// never a torn mix; then the reader resolves the first, a middle and the last region.
TEST_F(EtcdTest, AHundredThousandRegionsInOneBatchNeverShowAReaderATornDescriptor) {
    auto target = Engine::create(config("hundred-k", "10")), reader = Engine::create(config("watcher", "10"));
    ASSERT_TRUE(target && reader) << (!target ? target.error() : reader.error()).message;
    constexpr size_t kRegions = 100000, kSize = 64;
    std::vector<uint8_t> remote(kRegions * kSize), local(kSize);
    for (size_t i = 0; i < remote.size(); ++i) remote[i] = static_cast<uint8_t>(i * 5 + 1);
    const uint64_t base = reinterpret_cast<uintptr_t>(remote.data());
    std::vector<MemoryRange> ranges;
    std::vector<void *> addrs;
    for (size_t i = 0; i < kRegions; ++i) {
        ranges.push_back({remote.data() + i * kSize, kSize});
        addrs.push_back(remote.data() + i * kSize);
    }
    ASSERT_TRUE((*reader)->register_memory(local.data(), local.size()));
    auto seg = (*reader)->open_segment("hundred-k");
    ASSERT_TRUE(seg) << seg.error().message;

    // Fetches until `stop`; a problem is the first fetch that is not [lo, hi) of the regions in
    // order with hi == kRegions (unregistering) or lo == 0 (registering).
    std::atomic<bool> stop{false}, removing{false};
    size_t fetches = 0, partial = 0;
    std::string problem;
    std::thread watch([&] {
        while (!stop && problem.empty()) {
            bool registering = !removing;  // when the fetch began (it may end after the switch)
            auto regions = (*reader)->segment_regions(*seg);
            ++fetches;
            if (!regions) {
                problem = "fetch failed: " + regions.error().message;
                break;
            }
            if (regions->empty()) continue;
            size_t lo = ((*regions)[0].addr - base) / kSize, hi = lo + regions->size();
            for (size_t k = 0; k < regions->size() && problem.empty(); k += 997)
                if ((*regions)[k].addr != base + (lo + k) * kSize) problem = cat("torn: region ", k, " of a fetch");
            // A suffix (or all) is always a whole state of the unregister; a shorter prefix only
            // while the register may have been going on.
            if (problem.empty() && hi != kRegions && !(lo == 0 && registering))
                problem =
                    cat("fetched [", lo, ", ", hi, ") ", registering ? "while registering" : "while unregistering");
            partial += hi - lo < kRegions;
        }
    });
    JoinOnExit joiner{watch, &stop};  // an assertion below returns early: the watcher stops first
    auto r = (*target)->register_memory_batch(ranges);
    EXPECT_TRUE(r) << r.error().message;
    auto regions = (*reader)->segment_regions(*seg);
    ASSERT_TRUE(regions) << regions.error().message;
    EXPECT_EQ(regions->size(), kRegions);
    for (size_t i : {size_t{0}, kRegions / 2 + 3, kRegions - 1}) {
        ASSERT_TRUE(read_all(**reader, *seg, base + i * kSize, local));
        EXPECT_EQ(memcmp(local.data(), remote.data() + i * kSize, kSize), 0) << "region " << i;
    }
    removing = true;
    r = (*target)->unregister_memory_batch(addrs);
    EXPECT_TRUE(r) << r.error().message;
    stop = true;
    watch.join();
    EXPECT_TRUE(problem.empty()) << problem << " (after " << fetches << " fetches)";
    regions = (*reader)->segment_regions(*seg);
    ASSERT_TRUE(regions) << regions.error().message;
    EXPECT_TRUE(regions->empty());
    printf("%zu fetches, %zu of them mid-batch\n", fetches, partial);
}

// A batch that fails half-way writes nothing to etcd (its changes cancel before they are
// published); one that cannot unregister an address unregisters nothing.
TEST_F(EtcdTest, AFailedBatchPublishesNothing) {
    auto target = Engine::create(config("failing", "10")), reader = Engine::create(config("onlooker", "10"));
    ASSERT_TRUE(target && reader) << (!target ? target.error() : reader.error()).message;
    constexpr size_t kRegions = 2000, kSize = 64;
    std::vector<uint8_t> remote(kRegions * kSize);
    std::vector<MemoryRange> ranges;
    std::vector<void *> addrs;
    for (size_t i = 0; i < kRegions; ++i) {
        ranges.push_back({remote.data() + i * kSize, kSize});
        addrs.push_back(remote.data() + i * kSize);
    }
    auto overlapping = ranges;
    overlapping[1500] = {remote.data() + 700 * kSize + 8, 8};
    int64_t before = store_revision(etcd.endpoint());
    ASSERT_GT(before, 0);
    auto r = (*target)->register_memory_batch(overlapping);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("range 1500 of 2000"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("(range 700 of this batch)"), std::string::npos) << r.error().message;
    EXPECT_EQ(store_revision(etcd.endpoint()), before) << "the failed batch wrote to etcd";
    auto seg = (*reader)->open_segment("failing");
    ASSERT_TRUE(seg) << seg.error().message;
    auto regions = (*reader)->segment_regions(*seg);
    ASSERT_TRUE(regions) << regions.error().message;
    EXPECT_TRUE(regions->empty());

    ASSERT_TRUE((*target)->register_memory_batch(ranges));
    before = store_revision(etcd.endpoint());
    auto unknown = addrs;
    unknown[1999] = remote.data() + 1999 * kSize + 1;
    r = (*target)->unregister_memory_batch(unknown);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -ENOENT);
    EXPECT_NE(r.error().message.find("address 1999 of 2000"), std::string::npos) << r.error().message;
    EXPECT_EQ(store_revision(etcd.endpoint()), before);
    regions = (*reader)->segment_regions(*seg);
    ASSERT_TRUE(regions) << regions.error().message;
    EXPECT_EQ(regions->size(), kRegions);
}
