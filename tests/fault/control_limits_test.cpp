// The control server (descriptors, notifications) against peers that hold connections open,
// flood it with garbage or drive its process out of descriptors: real sockets, real child
// processes. Honest peers from other addresses keep getting descriptors, refused peers are
// told which limit they hit, an out-of-descriptors server neither spins nor floods its log,
// and repeated warnings come as one line plus a count per interval.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "control/control_protocol.hpp"
#include "ferry/engine.hpp"
#include "peer_process.hpp"
#include "test_util.hpp"
#include "util/byte_codec.hpp"
#include "util/fd.hpp"

using namespace ferry;
using ferry::test::PeerProcess;
using Clock = std::chrono::steady_clock;

namespace {

uint16_t port_of(const std::string &segment) {
    return static_cast<uint16_t>(std::stoul(segment.substr(segment.rfind(':') + 1)));
}

// A control-channel client made by hand, from a chosen loopback source address (Linux routes
// all of 127/8 to lo, so 127.0.0.2 is "another host" as far as the server can tell).
class Conn {
public:
    Conn(uint16_t port, const char *source) {
        fd_ = Fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_in src{};
        src.sin_family = AF_INET;
        inet_pton(AF_INET, source, &src.sin_addr);
        if (::bind(fd_.get(), reinterpret_cast<sockaddr *>(&src), sizeof src) != 0) return;
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(port);
        inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
        connected_ = ::connect(fd_.get(), reinterpret_cast<sockaddr *>(&to), sizeof to) == 0;
    }
    bool connected() const { return connected_; }
    bool send(const std::vector<uint8_t> &bytes) {
        return ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
    }
    // One reply frame: {status, payload}; status -1 when the connection ended first.
    std::pair<int, std::string> reply(int guard_ms = 10000) {
        std::string got;
        auto until = Clock::now() + std::chrono::milliseconds(guard_ms);
        while (Clock::now() < until) {
            if (got.size() >= control::kHeaderBytes) {
                auto h = control::parse_header({reinterpret_cast<const uint8_t *>(got.data()), control::kHeaderBytes});
                if (got.size() >= control::kHeaderBytes + h.length)
                    return {h.code, got.substr(control::kHeaderBytes, h.length)};
            }
            pollfd p{fd_.get(), POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            char b[4096];
            ssize_t n = ::recv(fd_.get(), b, sizeof b, 0);
            if (n <= 0) break;
            got.append(b, static_cast<size_t>(n));
        }
        return {-1, got};
    }
    // The no-secret handshake: HELLO, then AUTH with the all-zero proof. True once accepted;
    // otherwise last_reply holds the refusal (or {-1, ...} when the connection just ended).
    bool handshake() {
        ByteWriter hello;
        hello.bytes(std::vector<uint8_t>(control::kNonceBytes, 7));
        hello.u32(0);
        hello.str("attacker");
        send(control::frame(control::kHello, hello.data()));  // a refused peer may be closed already
        if ((last_reply = reply()).first != 0) return false;
        if (!send(control::frame(control::kAuth, std::vector<uint8_t>(32, 0)))) return false;
        return (last_reply = reply()).first == 0;
    }
    std::pair<int, std::string> last_reply;
    // True when the server closes within guard_ms.
    bool closed_by_peer(int guard_ms) {
        auto until = Clock::now() + std::chrono::milliseconds(guard_ms);
        while (Clock::now() < until) {
            pollfd p{fd_.get(), POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            char b[4096];
            if (::recv(fd_.get(), b, sizeof b, 0) <= 0) return true;
        }
        return false;
    }

private:
    Fd fd_;
    bool connected_ = false;
};

std::string slurp(const std::string &path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

size_t count_lines(const std::string &text, const std::string &needle) {
    size_t n = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
    return n;
}

// CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat.
double cpu_seconds(pid_t pid) {
    std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    std::istringstream in(stat.substr(stat.rfind(')') + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
        if (i == 14) utime = std::stoull(field);
        if (i == 15) stime = std::stoull(field);
    }
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// ferry_test_peer under /bin/sh: a lower descriptor limit and stderr to a file when asked.
PeerProcess shell_peer(const std::string &setup, const std::vector<std::string> &options, const std::string &log) {
    std::string cmd = setup + "; exec \"$0\"";
    for (auto &o : options) cmd += " --option " + o;
    cmd += " 2>" + log;
    return PeerProcess({"-c", cmd, FERRY_TEST_PEER_BIN}, "/bin/sh");
}

// Opens the segment from this process's engine (source 127.0.0.1), retried until `deadline`.
Result<void> fetch_descriptor(const std::string &segment, std::chrono::seconds patience) {
    auto until = Clock::now() + patience;
    Result<void> last = std::unexpected(Error{-1, "not tried"});
    while (Clock::now() < until) {
        auto e = Engine::create({{"plugins", "tcp"}, {"handshake_timeout_ms", "3000"}});
        if (!e) return std::unexpected(e.error());
        auto seg = (*e)->open_segment(segment);
        if (seg) return {};
        last = std::unexpected(seg.error());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // retry pacing, not synchronisation
    }
    return last;
}

// A handshaken connection, retried for a while: a slot freed by a connection that just closed
// is free once the server has seen the close.
std::unique_ptr<Conn> held_connection(uint16_t port, const char *source) {
    auto until = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < until) {
        auto c = std::make_unique<Conn>(port, source);
        if (c->connected() && c->handshake()) return c;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // retry pacing
    }
    return nullptr;
}

}  // namespace

// 1,100 handshaken connections that then say nothing, all from one address: the server keeps
// at most control_max_connections_per_peer (128) of them, tells the rest why it refuses, and a
// peer from another address still gets its descriptor.
TEST(ControlLimits, IdleConnectionsFromOneAddressDoNotLockOthersOut) {
    PeerProcess target({"--size", "65536"});
    ASSERT_TRUE(target.ok) << target.error;
    uint16_t port = port_of(target.segment);
    std::vector<std::unique_ptr<Conn>> held;
    size_t accepted = 0, refused_with_reason = 0;
    std::string reason;
    for (int i = 0; i < 1100; ++i) {
        auto c = std::make_unique<Conn>(port, "127.0.0.2");
        ASSERT_TRUE(c->connected()) << "connection " << i;
        if (c->handshake()) ++accepted;
        else {
            EXPECT_EQ(c->last_reply.first, EUSERS) << "connection " << i << ": " << c->last_reply.second;
            if (reason.empty()) reason = c->last_reply.second;
            ++refused_with_reason;
        }
        held.push_back(std::move(c));
    }
    std::cout << accepted << " handshaken connections held, " << refused_with_reason << " refused: " << reason << "\n";
    EXPECT_EQ(accepted, 128u) << "control_max_connections_per_peer is 128 by default";
    // A refused client reads the reason (the handshake reply was the refusal frame).
    Conn extra(port, "127.0.0.2");
    ASSERT_TRUE(extra.connected());
    auto r = extra.reply(5000);
    EXPECT_EQ(r.first, EUSERS) << r.second;
    EXPECT_NE(r.second.find("refused the connection: 128 connections already open from this address"),
              std::string::npos)
        << r.second;
    auto start = Clock::now();
    auto honest = fetch_descriptor(target.segment, std::chrono::seconds(10));
    EXPECT_TRUE(honest) << honest.error().message;
    std::cout << "honest peer from 127.0.0.1: descriptor in "
              << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count() << " ms\n";
}

// The honest client shows which limit it hit, per address and in all; idle and silent
// connections are closed by their deadlines, after which it is served again.
TEST(ControlLimits, RefusalNamesTheLimitAndDeadlinesFreeTheSlots) {
    auto t = Engine::create({{"plugins", "tcp"},
                             {"control_max_connections_per_peer", "4"},
                             {"control_max_connections", "6"},
                             {"handshake_timeout_ms", "3000"},
                             {"control_idle_timeout_ms", "1500"}});
    ASSERT_TRUE(t) << t.error().message;
    const std::string segment = (*t)->segment_name();
    uint16_t port = port_of(segment);
    {
        std::vector<std::unique_ptr<Conn>> mine;
        for (int i = 0; i < 4; ++i) {
            mine.push_back(std::make_unique<Conn>(port, "127.0.0.1"));
            ASSERT_TRUE(mine.back()->handshake()) << i;
        }
        auto e = Engine::create({{"plugins", "tcp"}});
        ASSERT_TRUE(e);
        auto seg = (*e)->open_segment(segment);
        ASSERT_FALSE(seg);
        EXPECT_EQ(seg.error().code, -EUSERS);
        EXPECT_NE(seg.error().message.find("control server at " + segment +
                                           " refused the connection: 4 connections already open from this address"),
                  std::string::npos)
            << seg.error().message;
        std::cout << "per address: " << seg.error().message << "\n";
    }
    // The server sees those four close soon, not at once: served again once it has.
    ASSERT_TRUE(fetch_descriptor(segment, std::chrono::seconds(10)));
    {
        std::vector<std::unique_ptr<Conn>> others;
        for (const char *src : {"127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3", "127.0.0.3"})
            others.push_back(held_connection(port, src));
        for (auto &c : others) ASSERT_TRUE(c) << "could not hold six connections";
        auto e = Engine::create({{"plugins", "tcp"}});
        ASSERT_TRUE(e);
        auto s = (*e)->open_segment(segment);
        ASSERT_FALSE(s);
        EXPECT_NE(s.error().message.find("refused the connection: 6 connections already open in all"),
                  std::string::npos)
            << s.error().message;
        std::cout << "in all: " << s.error().message << "\n";
        // Authenticated but idle: closed after control_idle_timeout_ms.
        for (auto &c : others) EXPECT_TRUE(c->closed_by_peer(15000)) << "an idle connection was kept";
    }
    // Connected but silent (no HELLO): closed after handshake_timeout_ms.
    Conn silent(port, "127.0.0.4");
    ASSERT_TRUE(silent.connected());
    auto start = Clock::now();
    EXPECT_TRUE(silent.closed_by_peer(15000)) << "a connection that never sent HELLO was kept";
    EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(2000));
    auto honest = fetch_descriptor(segment, std::chrono::seconds(10));
    EXPECT_TRUE(honest) << honest.error().message;
}

// A target whose process runs out of descriptors (RLIMIT_NOFILE 64) while connections keep
// arriving: it refuses them with a reason instead of spinning in accept, its log gets a line
// and a count instead of one line per attempt, and once the hogs leave it serves again.
TEST(ControlLimits, OutOfDescriptorsNeitherSpinsNorFloodsTheLog) {
    test::TempDir dir;
    std::string log = (dir / "target.log").string();
    auto target = shell_peer("ulimit -n 64",
                             {"handshake_timeout_ms=60000", "control_max_connections_per_peer=100000",
                              "control_max_connections=100000", "control_log_interval_ms=60000"},
                             log);
    ASSERT_TRUE(target.ok) << target.error << " " << slurp(log);
    uint16_t port = port_of(target.segment);
    std::vector<std::unique_ptr<Conn>> hogs;
    // Fewer than the ~40 descriptors left plus the listen backlog (128), so every connect returns.
    for (int i = 0; i < 150; ++i) {
        hogs.push_back(std::make_unique<Conn>(port, "127.0.0.2"));
        ASSERT_TRUE(hogs.back()->connected()) << i;
    }
    // The server is out of descriptors now. Measure it for 3 s.
    double cpu0 = cpu_seconds(target.pid());
    std::this_thread::sleep_for(std::chrono::seconds(3));  // the measuring window itself
    double cpu = cpu_seconds(target.pid()) - cpu0;
    // Only Ferry's lines count: under UBSan the child's log also holds "invalid vptr" reports,
    // because the sanitizer probes memory through a pipe() and that fails at EMFILE too.
    std::string text = slurp(log);
    size_t lines = count_lines(text, "control:");
    std::cout << "out of descriptors: " << cpu << " CPU s in 3 s, " << lines << " control log lines\n";
    EXPECT_LT(cpu, 0.5) << "the control server spins while out of descriptors";
    EXPECT_LE(lines, 4u) << "one log line per refused connection";
    // A peer arriving now is told why.
    auto e = Engine::create({{"plugins", "tcp"}, {"handshake_timeout_ms", "3000"}});
    ASSERT_TRUE(e);
    auto seg = (*e)->open_segment(target.segment);
    ASSERT_FALSE(seg);
    EXPECT_NE(seg.error().message.find("out of file descriptors"), std::string::npos) << seg.error().message;
    std::cout << "refused: " << seg.error().message << "\n";
    hogs.clear();
    auto honest = fetch_descriptor(target.segment, std::chrono::seconds(20));
    EXPECT_TRUE(honest) << honest.error().message;
}

// 300 connections of garbage: one warning line, then a count per interval, adding up to 300.
TEST(ControlLimits, GarbageConnectionsAreCountedNotLoggedEach) {
    test::TempDir dir;
    std::string log = (dir / "target.log").string();
    auto target = shell_peer("true", {"control_log_interval_ms=1000"}, log);
    ASSERT_TRUE(target.ok) << target.error << " " << slurp(log);
    uint16_t port = port_of(target.segment);
    std::vector<uint8_t> garbage(64, 0xAB);
    auto start = Clock::now();
    for (int i = 0; i < 300; ++i) {
        Conn c(port, "127.0.0.2");
        ASSERT_TRUE(c.connected());
        c.send(garbage);
        EXPECT_TRUE(c.closed_by_peer(10000));
    }
    // Wait for the count that closes the last interval.
    const std::string counted = "more control connections closed for protocol errors or deadlines in the last";
    size_t total = 0, single = 0;
    std::string text;
    auto until = Clock::now() + std::chrono::seconds(20);
    do {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // polling a log file
        text = slurp(log);
        total = 0;
        single = count_lines(text, "not a Ferry control frame");
        std::regex re("control: ([0-9]+) " + counted);
        for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
            total += std::stoul((*it)[1]);
    } while (single + total < 300 && Clock::now() < until);
    std::cout << single << " single lines, " << total << " counted, " << count_lines(text, "control:") << " lines:\n"
              << text << "\n";
    EXPECT_EQ(single + total, 300u) << "every bad connection is logged or counted";
    auto seconds = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count();
    EXPECT_LE(count_lines(text, "control:"), static_cast<size_t>(2 + seconds))
        << "a line and a count per interval, not a line each";
}
