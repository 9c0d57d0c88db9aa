// ferry_netns_client: the initiator host of the multi-host tests (tests/netns/netns_test.sh).
// It runs inside its own network namespace and talks to target hosts in others, with etcd as
// metadata. Each scenario prints what it saw and exits 0 when the engine behaved as required;
// it waits for the script's cues on stdin ("killed", "cut", "restored", "etcd-restarted").
//
//   ferry_netns_client <metadata url> <bind ip> <scenario> <segment> [<segment>]
//   scenarios: transfer A C | kill A C | link A | etcd A
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"

using namespace ferry;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<Engine> g_engine;
std::vector<uint8_t> g_local(64 << 20);

[[noreturn]] void fail_test(const std::string &why) {
    std::printf("FAIL: %s\n", why.c_str());
    std::fflush(stdout);
    std::exit(1);
}

void say(const std::string &line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

void cue(const std::string &expected) {
    say("WAITING " + expected);
    std::string line;
    if (!std::getline(std::cin, line) || line != expected) fail_test("expected cue '" + expected + "', got '" + line + "'");
}

struct Target {
    SegmentId seg;
    uint64_t base;
    uint64_t size;
};

Target open_target(const std::string &name) {
    auto seg = g_engine->open_segment(name);
    if (!seg) fail_test("open " + name + ": " + seg.error().message);
    auto regions = g_engine->segment_regions(*seg);
    if (!regions || regions->empty()) fail_test("no regions in " + name);
    return {*seg, regions->front().addr, regions->front().length};
}

Result<void> run(std::vector<Request> reqs, std::chrono::seconds limit = std::chrono::seconds(30)) {
    auto b = g_engine->submit(reqs);
    if (!b) return std::unexpected(b.error());
    auto w = g_engine->wait(*b, limit);
    if (w || w.error().code != -ETIMEDOUT) (void)g_engine->free_batch(*b);
    return w;
}

void read_and_verify(const Target &t, uint64_t len) {
    auto r = run({{Opcode::Read, g_local.data(), t.seg, t.base, len, ""}});
    if (!r) fail_test("read: " + r.error().message);
    for (uint64_t i = 0; i < len; ++i)
        if (g_local[i] != test::peer_pattern(i)) fail_test("byte " + std::to_string(i) + " read wrong");
}

bool eventually(const std::function<bool()> &check, std::chrono::seconds limit) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
        if (check()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return false;
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: ferry_netns_client <metadata> <bind ip> <scenario> <segment> [<segment>]\n");
        return 2;
    }
    std::string metadata = argv[1], bind_ip = argv[2], scenario = argv[3];
    argv += 1; // segments start at argv[3] below
    argc -= 1;
    auto e = Engine::create({{"plugins", "tcp"},
                             {"metadata", metadata},
                             {"local_server_name", "initiator"},
                             {"etcd_lease_ttl_s", "3"},
                             {"tcp.bind_ip", bind_ip},
                             {"local_ip", bind_ip},
                             {"tcp.op_timeout_ms", "3000"},
                             {"tcp.connect_timeout_ms", "2000"}});
    if (!e) fail_test("engine: " + e.error().message);
    g_engine = std::move(*e);
    if (auto r = g_engine->register_memory(g_local.data(), g_local.size()); !r) fail_test(r.error().message);

    if (scenario == "transfer") {
        for (int i = 3; i < argc; ++i) {
            Target t = open_target(argv[i]);
            read_and_verify(t, 1 << 20);
            say(std::string("read 1 MiB from ") + argv[i] + " across namespaces: verified");
        }
    } else if (scenario == "kill") {
        Target a = open_target(argv[3]), c = open_target(argv[4]);
        // 8 GiB: seconds of work, so the kill lands mid-transfer.
        std::vector<Request> big;
        for (int i = 0; i < 8192; ++i)
            big.push_back({Opcode::Write, g_local.data() + (i % 32) * (1 << 20), c.seg, c.base + (i % 32) * (1 << 20), 1 << 20, ""});
        auto doomed = g_engine->submit(big);
        if (!doomed) fail_test(doomed.error().message);
        cue("killed");
        auto w = g_engine->wait(*doomed, std::chrono::seconds(30));
        if (w) fail_test("8 GiB of writes to a host killed mid-transfer all succeeded");
        say("ops to the killed host failed: " + w.error().message);
        (void)g_engine->free_batch(*doomed);
        read_and_verify(a, 1 << 20);
        say(std::string("the other host still serves: ") + argv[3] + " verified");
        (void)g_engine->close_segment(c.seg);
        auto start = Clock::now();
        bool gone = eventually([&] {
            auto s = g_engine->open_segment(argv[4]);
            if (s) (void)g_engine->close_segment(*s);
            return !s;
        }, std::chrono::seconds(30));
        if (!gone) fail_test("the killed host's segment never left etcd");
        say("its segment left etcd after " + std::to_string(std::chrono::duration<double>(Clock::now() - start).count()) + " s");
    } else if (scenario == "link") {
        Target a = open_target(argv[3]);
        read_and_verify(a, 1 << 20);
        cue("cut");
        auto start = Clock::now();
        auto r = run({{Opcode::Read, g_local.data(), a.seg, a.base, 1 << 20, ""}}, std::chrono::seconds(30));
        if (r) fail_test("a read over a cut link succeeded");
        say("over the cut link the op failed after " +
            std::to_string(std::chrono::duration<double>(Clock::now() - start).count()) + " s: " + r.error().message);
        cue("restored");
        bool back = eventually([&] { return static_cast<bool>(run({{Opcode::Read, g_local.data(), a.seg, a.base, 4096, ""}},
                                                                   std::chrono::seconds(10))); },
                               std::chrono::seconds(40));
        if (!back) fail_test("ops never succeeded again after the link came back");
        read_and_verify(a, 1 << 20);
        say("after the link came back new ops succeed: verified");
    } else if (scenario == "etcd") {
        cue("etcd-restarted");
        bool back = eventually([&] {
            auto s = g_engine->open_segment(argv[3]);
            if (!s) return false;
            auto regions = g_engine->segment_regions(*s);
            return regions && !regions->empty();
        }, std::chrono::seconds(30));
        if (!back) fail_test(std::string(argv[3]) + " never registered again after etcd restarted");
        read_and_verify(open_target(argv[3]), 1 << 20);
        say(std::string(argv[3]) + " registered again after the etcd restart: verified");
    } else {
        fail_test("unknown scenario " + scenario);
    }
    say("PASS " + scenario);
    return 0;
}
