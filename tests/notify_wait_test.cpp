// Notifications a server can wait on, between this process and ferry_test_peer children (or a
// second engine here) over real sockets: the blocking take and its timeout, the pollable
// descriptor, the notification a batch sends after its WRITEs (and not when one failed), the
// receiver's queue bound against a flooding peer, strangers kept out with a cluster secret, and
// wait()'s message when several ops fail.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <optional>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

std::span<const uint8_t> bytes(std::string_view s) { return {reinterpret_cast<const uint8_t *>(s.data()), s.size()}; }
std::string text(const Notification &n) { return std::string(n.message.begin(), n.message.end()); }

std::unique_ptr<Engine> make_engine(Config extra = {}) {
    Config c{{"plugins", "tcp"}};
    for (auto &[k, v] : extra) c[k] = v;
    auto e = Engine::create(c);
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

bool readable(int fd, int timeout_ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

std::string range(const void *addr, size_t length) {
    std::ostringstream s;
    s << std::hex << reinterpret_cast<uintptr_t>(addr) << ":" << std::dec << length;
    return s.str();
}

long long ms_since(Clock::time_point t) { return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count(); }

}  // namespace

TEST(NotifyWait, ReturnsWhenOneArrivesAndTimesOutWithItsOwnCode) {
    PeerProcess peer({"--size", "4096"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make_engine();
    ASSERT_TRUE(engine);

    // Nothing queued: the timeout passes, with kWaitPending (not an op's -ETIMEDOUT).
    auto start = Clock::now();
    auto none = engine->wait_notifications(milliseconds(300));
    auto waited = ms_since(start);
    ASSERT_FALSE(none);
    EXPECT_EQ(none.error().code, kWaitPending);
    EXPECT_NE(none.error().message.find("300 ms"), std::string::npos) << none.error().message;
    EXPECT_GE(waited, 300);
    EXPECT_LT(waited, 5000);

    // A waiter blocked with a long timeout returns as soon as the peer's message is queued:
    // before the peer has even told us it was sent.
    std::string reply;
    Clock::time_point sent_at;
    std::thread sender([&] {
        std::this_thread::sleep_for(milliseconds(200));  // the waiter blocks first (not a synchronisation)
        sent_at = Clock::now();
        reply = peer.command("notify " + engine->segment_name() + " wake");
    });
    start = Clock::now();
    auto got = engine->wait_notifications(milliseconds(60000));
    auto returned_at = Clock::now();
    sender.join();
    ASSERT_TRUE(got) << got.error().message;
    ASSERT_EQ(reply, "OK");
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].from, peer.segment);
    EXPECT_EQ(text((*got)[0]), "wake");
    auto latency = std::chrono::duration_cast<std::chrono::microseconds>(returned_at - sent_at).count();
    std::cout << "command sent -> wait_notifications returned: " << latency << " us\n";
    EXPECT_LT(ms_since(start), 30000) << "the wait ran into its timeout instead of returning on arrival";

    // Queued before the wait: it returns at once with everything queued, oldest first.
    ASSERT_EQ(peer.command("notify " + engine->segment_name() + " one"), "OK");
    ASSERT_EQ(peer.command("notify " + engine->segment_name() + " two"), "OK");
    start = Clock::now();
    got = engine->wait_notifications(milliseconds(60000));
    ASSERT_TRUE(got);
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ(text((*got)[0]), "one");
    EXPECT_EQ(text((*got)[1]), "two");
    EXPECT_LT(ms_since(start), 1000);
    EXPECT_TRUE(engine->take_notifications().empty());
}

TEST(NotifyWait, TheDescriptorIsReadableExactlyWhileNotificationsAreQueued) {
    PeerProcess peer({"--size", "4096"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    const int fd = engine->notification_fd();
    ASSERT_GE(fd, 0);
    EXPECT_EQ(fd, engine->notification_fd()) << "one descriptor for the engine's life";
    EXPECT_FALSE(readable(fd, 0));

    for (auto word : {"a", "b", "c"}) ASSERT_EQ(peer.command("notify " + engine->segment_name() + " " + word), "OK");
    ASSERT_TRUE(readable(fd, 10000));
    EXPECT_TRUE(readable(fd, 0)) << "level-triggered: polling does not consume it";
    auto got = engine->take_notifications();
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(text(got[2]), "c");
    EXPECT_FALSE(readable(fd, 0)) << "drained: not readable any more";

    // Readable again on the next arrival; wait_notifications drains it as take does.
    ASSERT_EQ(peer.command("notify " + engine->segment_name() + " d"), "OK");
    ASSERT_TRUE(readable(fd, 10000));
    auto waited = engine->wait_notifications(milliseconds(1000));
    ASSERT_TRUE(waited);
    EXPECT_EQ(waited->size(), 1u);
    EXPECT_FALSE(readable(fd, 0));
    EXPECT_TRUE(engine->take_notifications().empty()) << "readable never without something to take";
}

// The peer WRITEs into two regions here with a notification attached; this thread blocks in
// wait_notifications and checks every byte the moment it returns, while the peer is still
// waiting for its batch.
TEST(NotifyWait, ABatchsNotificationArrivesAfterItsWritesAndNotWhenOneFailed) {
    PeerProcess peer({"--size", "1048576"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    std::vector<uint8_t> first(1 << 20, 0), second(64 << 10, 0);
    ASSERT_TRUE(engine->register_memory(first.data(), first.size()));
    ASSERT_TRUE(engine->register_memory(second.data(), second.size()));
    const std::string both = range(first.data(), first.size()) + " " + range(second.data(), second.size());

    std::string reply;
    std::thread writer([&] { reply = peer.command("batchnotify " + engine->segment_name() + " 7 written " + both); });
    auto got = engine->wait_notifications(milliseconds(60000));
    ASSERT_TRUE(got) << got.error().message;
    ASSERT_EQ(got->size(), 1u);
    EXPECT_EQ((*got)[0].from, peer.segment);
    EXPECT_EQ(text((*got)[0]), "written");
    for (size_t i = 0; i < first.size(); ++i) ASSERT_EQ(first[i], 7) << "byte " << i << " of the first region";
    for (size_t i = 0; i < second.size(); ++i) ASSERT_EQ(second[i], 7) << "byte " << i << " of the second region";
    writer.join();
    EXPECT_EQ(reply, "OK");

    // The peer keeps its cached descriptor; our tcp.so refuses the WRITE into the region we
    // no longer register. One op fails, so the notification is not sent.
    ASSERT_TRUE(engine->unregister_memory(second.data()));
    reply = peer.command("batchnotify " + engine->segment_name() + " 9 never " + both);
    EXPECT_EQ(reply.rfind("ERROR ", 0), 0u) << reply;
    EXPECT_NE(reply.find("1 of 2 ops failed: op 1 failed (WRITE 65536 bytes)"), std::string::npos) << reply;
    EXPECT_NE(reply.find("the batch's notification was not sent"), std::string::npos) << reply;
    // The peer's wait returned only after the batch was finished, notification included.
    EXPECT_TRUE(engine->take_notifications().empty()) << "a failed batch sent its notification";
    EXPECT_FALSE(readable(engine->notification_fd(), 0));
    for (size_t i = 0; i < second.size(); ++i) ASSERT_EQ(second[i], 7) << "byte " << i << " landed after unregister";
}

TEST(NotifyWait, ABatchWaitsForItsNotificationAndReportsOneNotDelivered) {
    auto target = make_engine({{"notification_queue_max", "1"}});
    auto sender = make_engine();
    ASSERT_TRUE(target && sender);
    std::vector<uint8_t> dst(256 << 10, 0), src(256 << 10, 5);
    ASSERT_TRUE(target->register_memory(dst.data(), dst.size()));
    ASSERT_TRUE(sender->register_memory(src.data(), src.size()));
    auto seg = sender->open_segment(target->segment_name());
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<Request> writes;
    for (size_t off = 0; off < dst.size(); off += 32 << 10)
        writes.push_back(
            {Opcode::Write, src.data() + off, *seg, reinterpret_cast<uintptr_t>(dst.data()) + off, 32 << 10, ""});

    auto b = sender->submit_with_notification(writes, *seg, bytes("done"));
    ASSERT_TRUE(b) << b.error().message;
    auto w = sender->wait(*b, milliseconds(60000));
    ASSERT_TRUE(w) << w.error().message;
    // wait() returned after delivery: it is queued there now, no polling needed.
    auto got = target->take_notifications();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(text(got[0]), "done");
    EXPECT_EQ(got[0].from, sender->segment_name());
    ASSERT_TRUE(sender->free_batch(*b));
    for (size_t i = 0; i < dst.size(); ++i) ASSERT_EQ(dst[i], 5) << "byte " << i;

    // The target's queue (one entry) is full: the data lands, the notification is refused, and
    // wait() says so with the refusal's code.
    ASSERT_TRUE(sender->send_notification(*seg, bytes("filler")));
    b = sender->submit_with_notification(writes, *seg, bytes("late"));
    ASSERT_TRUE(b);
    w = sender->wait(*b, milliseconds(60000));
    ASSERT_FALSE(w);
    EXPECT_EQ(w.error().code, -ENOBUFS);
    EXPECT_NE(w.error().message.find("succeeded, but its notification to segment"), std::string::npos)
        << w.error().message;
    EXPECT_NE(w.error().message.find("take_notifications"), std::string::npos) << w.error().message;
    for (size_t i = 0; i < writes.size(); ++i) EXPECT_EQ(sender->status(*b, i)->state, OpState::Done);
    ASSERT_TRUE(sender->free_batch(*b));
    got = target->take_notifications();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(text(got[0]), "filler");

    // Refused before anything moves: too long, or a target that is not open.
    std::vector<uint8_t> big(kMaxNotificationBytes + 1);
    auto too_big = sender->submit_with_notification(writes, *seg, big);
    ASSERT_FALSE(too_big);
    EXPECT_EQ(too_big.error().code, -EMSGSIZE);
    auto nowhere = sender->submit_with_notification(writes, *seg + 100, bytes("x"));
    ASSERT_FALSE(nowhere);
    EXPECT_EQ(nowhere.error().code, -ENOENT);
    EXPECT_NE(nowhere.error().message.find("open_segment"), std::string::npos) << nowhere.error().message;
}

TEST(NotifyWait, AnEngineDestroyedWithANotificationPendingTearsDownCleanly) {
    auto target = make_engine();
    ASSERT_TRUE(target);
    std::vector<uint8_t> dst(1 << 20), src(1 << 20, 3);
    ASSERT_TRUE(target->register_memory(dst.data(), dst.size()));
    for (int round = 0; round < 5; ++round) {
        auto sender = make_engine();
        ASSERT_TRUE(sender);
        ASSERT_TRUE(sender->register_memory(src.data(), src.size()));
        auto seg = sender->open_segment(target->segment_name());
        ASSERT_TRUE(seg);
        Request w{Opcode::Write, src.data(), *seg, reinterpret_cast<uintptr_t>(dst.data()), src.size(), ""};
        auto b = sender->submit_with_notification(std::span(&w, 1), *seg, bytes("bye"));
        ASSERT_TRUE(b);
        if (round % 2) (void)sender->status(*b, 0);  // sometimes drive it part of the way
    }                                                // destroyed with the batch (and maybe its notification) in flight
    (void)target->take_notifications();
}

// A server thread blocked without a timeout is released when its engine is destroyed.
TEST(NotifyWait, AWaiterIsReleasedWhenItsEngineIsDestroyed) {
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    std::atomic<pid_t> tid{0};
    std::optional<Result<std::vector<Notification>>> result;
    std::thread waiter([&] {
        tid = static_cast<pid_t>(::syscall(SYS_gettid));
        result = engine->wait_notifications(milliseconds(-1));
    });
    // Destroy only once the waiter sleeps (state S): after publishing its id it does nothing
    // but enter wait_notifications, so it sleeps on the condition variable there.
    bool blocked = false;
    for (auto until = Clock::now() + std::chrono::seconds(30); !blocked && Clock::now() < until;) {
        if (pid_t t = tid.load()) {
            std::ifstream stat("/proc/self/task/" + std::to_string(t) + "/stat");
            std::string line((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
            auto paren = line.rfind(')');
            blocked = paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'S';
        }
        if (!blocked) std::this_thread::sleep_for(milliseconds(5));  // polling the waiter's state
    }
    ASSERT_TRUE(blocked) << "the waiter never blocked";
    engine.reset();
    waiter.join();
    ASSERT_TRUE(result.has_value());
    ASSERT_FALSE(*result);
    EXPECT_EQ(result->error().code, -ECANCELED);
    EXPECT_NE(result->error().message.find("destroyed"), std::string::npos) << result->error().message;
}

TEST(NotifyWait, AFloodingPeerIsHeldToTheQueueBound) {
    PeerProcess flooder({"--size", "4096"});
    ASSERT_TRUE(flooder.ok) << flooder.error;
    auto engine = make_engine({{"notification_queue_max", "100"}});
    ASSERT_TRUE(engine);
    EXPECT_EQ(flooder.command("flood " + engine->segment_name() + " 3000"), "FLOODED 100 2900 0");
    auto got = engine->wait_notifications(milliseconds(1000));
    ASSERT_TRUE(got);
    EXPECT_EQ(got->size(), 100u);
    EXPECT_FALSE(readable(engine->notification_fd(), 0));
    EXPECT_EQ(flooder.command("flood " + engine->segment_name() + " 150"), "FLOODED 100 50 0")
        << "taking made room again";
}

TEST(NotifyWait, StrangersCannotWakeAServerThatHasASecret) {
    auto engine = make_engine({{"auth_secret", "a cluster secret of some length"}});
    ASSERT_TRUE(engine);
    PeerProcess stranger({"--size", "4096"});
    ASSERT_TRUE(stranger.ok) << stranger.error;
    std::string reply = stranger.command("notify " + engine->segment_name() + " let-me-in");
    EXPECT_EQ(reply.rfind("ERROR ", 0), 0u) << reply;
    EXPECT_NE(reply.find("authentication failed"), std::string::npos) << reply;
    EXPECT_FALSE(readable(engine->notification_fd(), 0));
    auto none = engine->wait_notifications(milliseconds(200));
    ASSERT_FALSE(none);
    EXPECT_EQ(none.error().code, kWaitPending);
}

// Several ops fail: wait() names how many, the first three (index, op, length, why), and
// stays short; the C API gives the same message.
TEST(NotifyWait, WaitNamesHowManyOpsFailedAndTheFirstFew) {
    // Declared before the engines, so freed after them: the target's tcp.so may still be sending
    // a reply from `kept` (registered until its engine goes) when wait() has returned.
    std::vector<uint8_t> kept(64 << 10, 1), dropped(64 << 10, 2), local(64 << 10);
    auto target = make_engine();
    auto engine = make_engine();
    ASSERT_TRUE(target && engine);
    ASSERT_TRUE(target->register_memory(kept.data(), kept.size()));
    ASSERT_TRUE(target->register_memory(dropped.data(), dropped.size()));
    ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    auto seg = engine->open_segment(target->segment_name());
    ASSERT_TRUE(seg);
    ASSERT_TRUE(target->unregister_memory(dropped.data()));  // our cached descriptor still lists it

    const std::set<size_t> bad = {4, 9, 17, 50, 77};
    std::vector<Request> reads;
    for (size_t i = 0; i < 128; ++i) {
        auto &from = bad.count(i) ? dropped : kept;
        reads.push_back(
            {Opcode::Read, local.data() + i * 512, *seg, reinterpret_cast<uintptr_t>(from.data()) + i * 512, 512, ""});
    }
    auto b = engine->submit(reads);
    ASSERT_TRUE(b) << b.error().message;
    auto w = engine->wait(*b, milliseconds(60000));
    ASSERT_FALSE(w);
    const std::string &m = w.error().message;
    std::cout << "wait's error (" << m.size() << " chars): " << m << "\n";
    EXPECT_EQ(m.rfind("5 of 128 ops failed: op 4 failed (READ 512 bytes): ", 0), 0u) << m;
    EXPECT_NE(m.find("; op 9 failed (READ 512 bytes): "), std::string::npos) << m;
    EXPECT_NE(m.find("; op 17 failed (READ 512 bytes): "), std::string::npos) << m;
    EXPECT_EQ(m.find("op 50 failed"), std::string::npos) << "only the first three are shown";
    EXPECT_NE(m.find("and 2 more"), std::string::npos) << m;
    EXPECT_LT(m.size(), 1200u);
    EXPECT_EQ(w.error().code, engine->status(*b, 4)->code) << "the first failed op's code";
    for (size_t i = 0; i < reads.size(); ++i)
        EXPECT_EQ(engine->status(*b, i)->state, bad.count(i) ? OpState::Failed : OpState::Done) << "op " << i;
    ASSERT_TRUE(engine->free_batch(*b));
}

TEST(NotifyWait, CApiWaitsPollsAndAttachesANotificationToABatch) {
    const char *keys[] = {"plugins"};
    const char *values[] = {"tcp"};
    ferry_engine_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 1, &a), 0) << ferry_last_error();
    ASSERT_EQ(ferry_engine_create(keys, values, 1, &b), 0) << ferry_last_error();
    char name_b[256];
    ASSERT_EQ(ferry_engine_segment_name(b, name_b, sizeof name_b), 0);
    std::vector<uint8_t> dst(4096, 0), src(4096, 8);
    ASSERT_EQ(ferry_register(b, dst.data(), dst.size(), FERRY_MEMORY_HOST, -1, FERRY_REMOTE_WRITE), 0)
        << ferry_last_error();
    ASSERT_EQ(ferry_register(a, src.data(), src.size(), FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ), 0)
        << ferry_last_error();
    ferry_segment_id_t seg = 0;
    ASSERT_EQ(ferry_open_segment(a, name_b, &seg), 0) << ferry_last_error();

    int fd = -1;
    ASSERT_EQ(ferry_notification_fd(b, &fd), 0);
    ASSERT_GE(fd, 0);
    EXPECT_EQ(ferry_notification_fd(b, nullptr), -EINVAL);
    ferry_notification_t *notes = reinterpret_cast<ferry_notification_t *>(0x1);
    size_t count = 99;
    EXPECT_EQ(ferry_wait_notifications(b, 50, &notes, &count), -EINPROGRESS);
    EXPECT_EQ(notes, reinterpret_cast<ferry_notification_t *>(0x1)) << "untouched on timeout";
    EXPECT_EQ(count, 99u);

    ferry_request_t w{FERRY_WRITE, 0, src.data(), seg, reinterpret_cast<uintptr_t>(dst.data()), dst.size(), nullptr};
    ferry_batch_id_t batch = 0;
    EXPECT_EQ(ferry_submit_with_notification(a, &w, 1, seg, nullptr, 3, &batch), -EINVAL);
    ASSERT_EQ(ferry_submit_with_notification(a, &w, 1, seg, "sent", 4, &batch), 0) << ferry_last_error();
    ASSERT_EQ(ferry_wait_batch(a, batch, 60000), 0) << ferry_last_error();
    ASSERT_EQ(ferry_free_batch(a, batch), 0);
    EXPECT_TRUE(readable(fd, 0));
    ASSERT_EQ(ferry_wait_notifications(b, -1, &notes, &count), 0) << ferry_last_error();
    ASSERT_EQ(count, 1u);
    ASSERT_EQ(notes[0].length, 4u);
    EXPECT_EQ(std::memcmp(notes[0].data, "sent", 4), 0);
    ferry_free_notifications(notes, count);
    EXPECT_FALSE(readable(fd, 0));
    for (auto v : dst) ASSERT_EQ(v, 8);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
}
