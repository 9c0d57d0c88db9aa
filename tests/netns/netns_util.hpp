// The initiator of the multi-host tests (netns_client.cpp, netns_adaptive.cpp): its engine,
// what every scenario prints and checks, and how it waits for the script's cues.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"

using namespace ferry;
using Clock = std::chrono::steady_clock;

// Failover and rails scenarios (netns_adaptive.cpp): the stall detection they run with.
constexpr int kTcpStallMs = 500;
constexpr int kEfaOpTimeoutMs = 5000;
constexpr int kFailoverCooldownMs = 1500;

constexpr uint64_t kMiB = 1 << 20;
// Remote layout inside each target's 64 MiB buffer: [0, 32 MiB) keeps the pattern the target
// filled it with (read and checked); writes land in a window per transport above it.
constexpr uint64_t kPatternBytes = kMiB;
constexpr uint64_t kWriteBytes = 4 * kMiB;
constexpr uint64_t kWriteWindow = 32 * kMiB;

inline std::unique_ptr<Engine> g_engine;
inline std::vector<uint8_t> g_local(64 * kMiB);
inline std::vector<std::string> g_transports;

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

inline std::string fmt_s(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f s", s);
    return buf;
}

[[noreturn]] inline void fail_test(const std::string &why) {
    std::printf("FAIL: %s\n", why.c_str());
    std::fflush(stdout);
    std::_Exit(1);  // the engine may be stuck on what failed: no destructors
}

inline void say(const std::string &line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

inline void pass(const std::string &what) { say("PASS: " + what); }

inline void cue(const std::string &expected) {
    say("WAITING " + expected);
    std::string line;
    if (!std::getline(std::cin, line) || line != expected)
        fail_test("expected cue '" + expected + "', got '" + line + "'");
}

struct Host {
    std::string name;  // segment name in etcd
    std::string ip;    // its namespace address: errors about it must name it
};

struct Target {
    Host host;
    SegmentId seg;
    uint64_t base;
    uint64_t size;
};

inline Target open_target(const Host &h) {
    auto seg = g_engine->open_segment(h.name);
    if (!seg) fail_test("open " + h.name + ": " + seg.error().message);
    auto regions = g_engine->segment_regions(*seg);
    if (!regions || regions->empty()) fail_test("no regions in " + h.name);
    if (regions->front().length < kWriteWindow + 2 * kWriteBytes) fail_test(h.name + "'s buffer is too small");
    return {h, *seg, regions->front().addr, regions->front().length};
}

inline Result<void> run(std::vector<Request> reqs, std::chrono::milliseconds limit) {
    auto b = g_engine->submit(reqs);
    if (!b) return std::unexpected(b.error());
    auto w = g_engine->wait(*b, limit);
    if (w || w.error().code != -ETIMEDOUT) (void)g_engine->free_batch(*b);
    return w;
}

inline Result<void> run(std::vector<Request> reqs) { return run(std::move(reqs), std::chrono::seconds(30)); }

inline Result<void> run_on(Engine &e, std::vector<Request> reqs) {
    auto b = e.submit(reqs);
    if (!b) return std::unexpected(b.error());
    auto w = e.wait(*b, std::chrono::seconds(30));
    (void)e.free_batch(*b);
    return w;
}

inline uint8_t written_pattern(uint64_t i, size_t transport) {
    return static_cast<uint8_t>((i * 37 + 11 + transport * 101) ^ (i >> 13));
}

void scenario_failover(const Host &host, const std::string &first, const std::string &second);
void scenario_rails(const Host &host, const Config &base, const std::string &rail1, const std::string &rail2,
                    const std::string &rail2_dev);
