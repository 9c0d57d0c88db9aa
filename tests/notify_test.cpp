// Notifications over the engines' control channel, between this process and ferry_test_peer
// children: both directions, order, sender names, limits (size, receiver queue), a WRITE's
// bytes visible when its notification is taken, and the C API's drain/free calls.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

std::span<const uint8_t> bytes(std::string_view s) { return {reinterpret_cast<const uint8_t *>(s.data()), s.size()}; }

std::unique_ptr<Engine> make_engine(Config extra = {}) {
    Config c{{"plugins", "tcp"}};
    for (auto &[k, v] : extra) c[k] = v;
    auto e = Engine::create(c);
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

// Takes until `count` notifications arrived or 10 s passed.
std::vector<Notification> take_at_least(Engine &engine, size_t count) {
    std::vector<Notification> all;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (all.size() < count && std::chrono::steady_clock::now() < deadline) {
        auto got = engine.take_notifications();
        all.insert(all.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
        if (all.size() < count) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return all;
}

}  // namespace

TEST(Notify, ToAnotherProcessInOrderWithTheSendersName) {
    PeerProcess peer({"--size", "4096"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    for (auto text : {"first", "second", "third"}) {
        auto r = engine->send_notification(*seg, bytes(text));
        ASSERT_TRUE(r) << r.error().message;
    }
    // Sent means queued there: the peer takes all three at once, oldest first.
    const std::string me = engine->segment_name();
    EXPECT_EQ(peer.command("take"), "TAKEN 3 " + me + "|first " + me + "|second " + me + "|third");
    EXPECT_EQ(peer.command("take"), "TAKEN 0") << "taking drains the queue";
    // An empty message is a message too.
    ASSERT_TRUE(engine->send_notification(*seg, {}));
    EXPECT_EQ(peer.command("take"), "TAKEN 1 " + me + "|");
}

TEST(Notify, FromAnotherProcessWithItsSegmentName) {
    PeerProcess peer({"--size", "4096"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    EXPECT_TRUE(engine->take_notifications().empty());
    ASSERT_EQ(peer.command("notify " + engine->segment_name() + " hello"), "OK");
    ASSERT_EQ(peer.command("notify " + engine->segment_name() + " again"), "OK");
    auto notes = engine->take_notifications();  // already queued when the peer said OK
    ASSERT_EQ(notes.size(), 2u);
    EXPECT_EQ(notes[0].from, peer.segment);
    EXPECT_EQ(std::string(notes[0].message.begin(), notes[0].message.end()), "hello");
    EXPECT_EQ(std::string(notes[1].message.begin(), notes[1].message.end()), "again");
}

TEST(Notify, AWritesBytesAreVisibleWhenItsNotificationIsTaken) {
    PeerProcess peer({"--size", "4194304"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    std::vector<uint8_t> target(4 << 20, 0);
    ASSERT_TRUE(engine->register_memory(target.data(), target.size()));
    std::ostringstream cmd;
    cmd << "writenotify " << engine->segment_name() << " " << std::hex << reinterpret_cast<uintptr_t>(target.data())
        << std::dec << " " << target.size() << " 90 written";
    ASSERT_EQ(peer.command(cmd.str()), "OK");
    auto notes = take_at_least(*engine, 1);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_EQ(std::string(notes[0].message.begin(), notes[0].message.end()), "written");
    for (size_t i = 0; i < target.size(); ++i) ASSERT_EQ(target[i], 90) << "byte " << i << " not yet written";
}

TEST(Notify, SizeLimitAndUnknownSegmentAreRefusedClearly) {
    PeerProcess peer({"--size", "4096"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<uint8_t> big(kMaxNotificationBytes + 1, 'x');
    auto r = engine->send_notification(*seg, big);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EMSGSIZE);
    EXPECT_NE(r.error().message.find("exceed the limit"), std::string::npos) << r.error().message;
    big.pop_back();  // exactly the limit goes through
    r = engine->send_notification(*seg, big);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(peer.command("take").substr(0, 8), "TAKEN 1 ");

    auto missing = engine->send_notification(*seg + 1000, bytes("x"));
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code, -ENOENT);
    EXPECT_NE(missing.error().message.find("open_segment"), std::string::npos) << missing.error().message;
}

TEST(Notify, AFullReceiverQueueRefusesTheSenderUntilItIsTaken) {
    PeerProcess peer({"--size", "4096", "--option", "notification_queue_max=2"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    ASSERT_TRUE(engine->send_notification(*seg, bytes("a")));
    ASSERT_TRUE(engine->send_notification(*seg, bytes("b")));
    auto full = engine->send_notification(*seg, bytes("c"));
    ASSERT_FALSE(full);
    EXPECT_EQ(full.error().code, -ENOBUFS);
    EXPECT_NE(full.error().message.find("take_notifications"), std::string::npos) << full.error().message;
    const std::string me = engine->segment_name();
    EXPECT_EQ(peer.command("take"), "TAKEN 2 " + me + "|a " + me + "|b") << "the refused one was not queued";
    auto again = engine->send_notification(*seg, bytes("c"));
    ASSERT_TRUE(again) << again.error().message;
    EXPECT_EQ(peer.command("take"), "TAKEN 1 " + me + "|c");
}

TEST(Notify, AReceiverThatRestartedOnTheSamePortIsReachedAgain) {
    auto engine = make_engine();
    ASSERT_TRUE(engine);
    std::string name;
    {
        PeerProcess first({"--size", "4096"});
        ASSERT_TRUE(first.ok) << first.error;
        name = first.segment;
        auto seg = engine->open_segment(name);
        ASSERT_TRUE(seg) << seg.error().message;
        ASSERT_TRUE(engine->send_notification(*seg, bytes("one")));
        EXPECT_EQ(first.command("take"), "TAKEN 1 " + engine->segment_name() + "|one");
    }
    // The cached control connection is dead now; a restarted peer on the same port is found.
    PeerProcess second({"--size", "4096", "--option", "local_server_name=" + name});
    ASSERT_TRUE(second.ok) << second.error;
    auto seg = engine->open_segment(name);
    ASSERT_TRUE(seg);
    auto r = engine->send_notification(*seg, bytes("two"));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(second.command("take"), "TAKEN 1 " + engine->segment_name() + "|two");
}

TEST(Notify, CApiSendsAndDrainsIntoOneAllocation) {
    const char *keys[] = {"plugins"};
    const char *values[] = {"tcp"};
    ferry_engine_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 1, &a), 0) << ferry_last_error();
    ASSERT_EQ(ferry_engine_create(keys, values, 1, &b), 0) << ferry_last_error();
    char name_b[256], name_a[256];
    ASSERT_EQ(ferry_engine_segment_name(b, name_b, sizeof name_b), 0);
    ASSERT_EQ(ferry_engine_segment_name(a, name_a, sizeof name_a), 0);
    ferry_segment_id_t seg = 0;
    ASSERT_EQ(ferry_open_segment(a, name_b, &seg), 0) << ferry_last_error();

    ferry_notification_t *notes = reinterpret_cast<ferry_notification_t *>(0x1);
    size_t count = 99;
    ASSERT_EQ(ferry_take_notifications(b, &notes, &count), 0);
    EXPECT_EQ(notes, nullptr);
    EXPECT_EQ(count, 0u);

    ASSERT_EQ(ferry_send_notification(a, seg, "ping", 4), 0) << ferry_last_error();
    ASSERT_EQ(ferry_send_notification(a, seg, nullptr, 0), 0) << ferry_last_error();
    EXPECT_EQ(ferry_send_notification(a, seg, nullptr, 3), -EINVAL);
    ASSERT_EQ(ferry_take_notifications(b, &notes, &count), 0) << ferry_last_error();
    ASSERT_EQ(count, 2u);
    EXPECT_STREQ(notes[0].from, name_a);
    ASSERT_EQ(notes[0].length, 4u);
    EXPECT_EQ(std::memcmp(notes[0].data, "ping", 4), 0);
    EXPECT_EQ(notes[1].length, 0u);
    EXPECT_EQ(notes[1].data, nullptr);
    ferry_free_notifications(notes, count);
    ferry_free_notifications(nullptr, 0);

    std::vector<char> big(kMaxNotificationBytes + 1);
    EXPECT_EQ(ferry_send_notification(a, seg, big.data(), big.size()), -EMSGSIZE);
    EXPECT_NE(std::string(ferry_last_error()).find("exceed the limit"), std::string::npos) << ferry_last_error();
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
}

// The receiver closes a kept control connection once it has been idle for
// control_idle_timeout_ms; the next notification reconnects, and nothing is lost or doubled,
// including when the close and the send cross (many sends right at the idle deadline).
TEST(Notify, AfterTheReceiverClosedAnIdleConnection) {
    auto receiver = make_engine({{"control_idle_timeout_ms", "200"}});
    auto sender = make_engine();
    ASSERT_TRUE(receiver && sender);
    auto seg = sender->open_segment(receiver->segment_name());
    ASSERT_TRUE(seg) << seg.error().message;
    size_t sent = 0;
    for (int round = 0; round < 12; ++round) {
        auto r = sender->send_notification(*seg, bytes("n" + std::to_string(round)));
        ASSERT_TRUE(r) << "round " << round << ": " << r.error().message;
        ++sent;
        // Idle across the receiver's deadline, give or take: some rounds find the connection
        // closed, some race its close.
        std::this_thread::sleep_for(std::chrono::milliseconds(150 + 10 * round));  // the idle time under test
    }
    auto got = take_at_least(*receiver, sent);
    ASSERT_EQ(got.size(), sent);
    for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(std::string(got[i].message.begin(), got[i].message.end()), "n" + std::to_string(i));
}
