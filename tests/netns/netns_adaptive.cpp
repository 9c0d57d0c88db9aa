// The adaptive data path across hosts (tests/netns/netns_test.sh): failover between transports
// with one transport's packets dropped mid-batch, and tcp.so's rails over two shaped links.
#include "netns_util.hpp"

// When each op of a batch of 1 MiB ops ended (seconds after `start`) and which transport carried
// it, noted every 2 ms by a thread of its own while the scenario cues the script; a failed op
// or one still in flight after 60 s fails the test.
struct EndTimes {
    EndTimes(Engine &e, BatchId b, size_t n, Clock::time_point start)
        : ended(n, -1), carrier(n), left(n), poller([this, &e, b, start] {
              while (left.load() > 0) {
                  if (Clock::now() - start > std::chrono::seconds(60))
                      fail_test(std::to_string(left.load()) + " ops still in flight 60 s after submit");
                  for (size_t i = 0; i < ended.size(); ++i) {
                      if (ended[i] >= 0) continue;
                      auto st = e.status(b, i);
                      if (!st) fail_test(st.error().message);
                      if (st->state == OpState::Pending) continue;
                      if (st->state == OpState::Failed)
                          fail_test("op " + std::to_string(i) + " failed: " + st->message);
                      ended[i] = seconds_since(start);
                      carrier[i] = st->transport;
                      left.fetch_sub(1);
                  }
                  std::this_thread::sleep_for(std::chrono::milliseconds(2));
              }
          }) {}
    ~EndTimes() { join(); }
    void join() {
        if (poller.joinable()) poller.join();
    }
    void wait_until_left(size_t n) {
        while (left.load() > n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // "0.0:94 0.1:115 ...": MB/s of the ops that ended in each 100 ms (after join()).
    std::string per_100ms() const {
        double end = *std::max_element(ended.begin(), ended.end());
        std::string line;
        for (double w0 = 0; w0 < end; w0 += 0.1) {
            uint64_t bytes = 0;
            for (double t : ended)
                if (t >= w0 && t < w0 + 0.1) bytes += kMiB;
            char cell[48];
            std::snprintf(cell, sizeof cell, "%s%.1f:%.0f", line.empty() ? "" : " ", w0, bytes / 0.1 / 1e6);
            line += cell;
        }
        return line;
    }
    // The first time after `from` from which every 300 ms window up to the last full one moved at
    // least `rate` MB/s (a 100 ms window holds about ten 1 MiB ops here: one more or less is 10%);
    // -1 when none.
    double sustained_from(double from, double rate) const {
        constexpr double kWindow = 0.3;
        double end = *std::max_element(ended.begin(), ended.end());
        for (double w0 = from; w0 + kWindow <= end; w0 += 0.01) {
            bool ok = true;
            for (double w = w0; ok && w + kWindow <= end; w += kWindow) {
                uint64_t bytes = 0;
                for (double t : ended)
                    if (t >= w && t < w + kWindow) bytes += kMiB;
                ok = bytes / kWindow / 1e6 >= rate;
            }
            if (ok) return w0;
        }
        return -1;
    }
    std::vector<double> ended;
    std::vector<std::string> carrier;
    std::atomic<size_t> left;
    std::thread poller;
};

// Submits `writes` and, a quarter of the way through, cues the script to break a path (it does
// so between the cue and its answer); returns once every op ended, with when each did.
struct CutRun {
    BatchId batch = 0;
    std::unique_ptr<EndTimes> times;
    double cued_at = 0, cut_at = 0;  // seconds after submit
    Clock::time_point start;
};

CutRun run_and_cut(Engine &e, const std::vector<Request> &writes, const std::string &cue_name) {
    CutRun run;
    run.start = Clock::now();
    auto b = e.submit(writes);
    if (!b) fail_test("submit: " + b.error().message);
    run.batch = *b;
    run.times = std::make_unique<EndTimes>(e, *b, writes.size(), run.start);
    run.times->wait_until_left(writes.size() * 3 / 4);
    run.cued_at = seconds_since(run.start);
    cue(cue_name);
    run.cut_at = seconds_since(run.start);
    run.times->join();
    return run;
}

// Failover across hosts: 256 WRITEs of 1 MiB, no transport forced, to a target behind a link
// shaped by the script; mid-batch the script drops the first transport's packets (tc), its ops
// stall until their timeout and move to the second transport. tcp.so's op_timeout_ms counts
// from the last progress of a busy connection (kTcpStallMs); efa.so's from the op's post, so
// it must exceed the whole batch's time on the shaped link (kEfaOpTimeoutMs). Every op must
// succeed and every byte is read back over the second transport. Prints when each op ended, as
// throughput per 100 ms against time, and how long the move took. Then, once the dropped
// transport is restored and its pause over, new ops go over it again (tcp first only: libfabric's
// tcp provider reconnects on TCP's SYN backoff schedule, seconds).

void scenario_failover(const Host &host, const std::string &first, const std::string &second) {
    Target t = open_target(host);
    constexpr uint64_t kOps = 256;
    if (t.size < kOps * kMiB) fail_test(host.name + "'s buffer is smaller than " + std::to_string(kOps) + " MiB");
    std::vector<uint8_t> src(kOps * kMiB), back(kOps * kMiB);
    for (uint64_t i = 0; i < src.size(); ++i) src[i] = written_pattern(i, 7);
    if (auto r = g_engine->register_memory(src.data(), src.size()); !r) fail_test(r.error().message);
    if (auto r = g_engine->register_memory(back.data(), back.size()); !r) fail_test(r.error().message);
    std::vector<Request> writes;
    for (uint64_t i = 0; i < kOps; ++i)
        writes.push_back({Opcode::Write, src.data() + i * kMiB, t.seg, t.base + i * kMiB, kMiB, ""});
    // Connect both transports first (forced ops), so the batch measures moving, not connecting.
    for (const auto &tr : {first, second})
        if (auto r = run({{Opcode::Read, back.data(), t.seg, t.base, 4096, tr}}); !r)
            fail_test("warm-up read over " + tr + ": " + r.error().message);
    CutRun cut = run_and_cut(*g_engine, writes, "drop-" + first);
    auto b = &cut.batch;
    const EndTimes &times = *cut.times;
    const double cued_at = cut.cued_at, dropped_at = cut.cut_at;
    const auto &ended = times.ended;
    const auto &carrier = times.carrier;
    if (auto w = g_engine->wait(*b, std::chrono::seconds(1)); !w) fail_test("wait: " + w.error().message);
    (void)g_engine->free_batch(*b);
    size_t moved = 0;
    double first_after = 1e9;
    for (uint64_t i = 0; i < kOps; ++i)
        if (carrier[i] == second) {
            ++moved;
            first_after = std::min(first_after, ended[i]);
        }
    if (moved == 0) fail_test("no op moved to " + second + " after " + first + " was dropped");
    // Throughput per 100 ms, and over the second transport once it carried the moved ops.
    double end = *std::max_element(ended.begin(), ended.end());
    say("  throughput per 100 ms (MB/s), " + first + " dropped between " + fmt_s(cued_at) + " and " +
        fmt_s(dropped_at) + ":");
    say("  " + times.per_100ms());
    size_t before = kOps - moved;
    double rate_first = 0, rate_second = 0;
    {
        double last_first = 0;
        for (uint64_t i = 0; i < kOps; ++i)
            if (carrier[i] == first) last_first = std::max(last_first, ended[i]);
        if (before > 0 && last_first > 0) rate_first = before * kMiB / last_first / 1e6;
        if (end > first_after) rate_second = (moved - 1) * kMiB / (end - first_after) / 1e6;
    }
    char summary[400];
    std::snprintf(summary, sizeof summary,
                  "%zu ops moved from %s to %s; first moved op done %.0f-%.0f ms after the drop (op_timeout_ms %d); "
                  "%s carried %.0f MB/s before, %s %.0f MB/s after",
                  moved, first.c_str(), second.c_str(), (first_after - dropped_at) * 1e3, (first_after - cued_at) * 1e3,
                  first == "tcp" ? kTcpStallMs : kEfaOpTimeoutMs, first.c_str(), rate_first, second.c_str(),
                  rate_second);
    say(std::string("  ") + summary);
    if (auto r = run({{Opcode::Read, back.data(), t.seg, t.base, kOps * kMiB, second}}); !r)
        fail_test("read back over " + second + ": " + r.error().message);
    if (std::memcmp(src.data(), back.data(), src.size()) != 0) fail_test("bytes written did not read back equal");
    pass("failover across hosts: " + std::to_string(kOps) + " x 1 MiB WRITEs with " + first +
         "'s packets dropped mid-batch all succeeded, every byte read back over " + second + "; " + summary);
    auto stats = g_engine->stats();
    for (const auto &s : stats.transports)
        if (s.transport == first && (s.failovers == 0 || s.pauses == 0))
            fail_test(first + "'s stats do not show the failover (failovers " + std::to_string(s.failovers) +
                      ", pauses " + std::to_string(s.pauses) + ")");
    cue("restore-" + first);
    if (first != "tcp") return;
    // The pause ends kFailoverCooldownMs after the failure: new ops probe tcp and stay on it.
    std::this_thread::sleep_for(std::chrono::milliseconds(kFailoverCooldownMs + 200));
    uint64_t done_before = 0, done_after = 0;
    for (const auto &s : g_engine->stats().transports)
        if (s.transport == first) done_before = s.write.done;
    std::vector<Request> again(writes.begin(), writes.begin() + 16);
    if (auto r = run(again); !r) fail_test("WRITEs after " + first + " was restored: " + r.error().message);
    for (const auto &s : g_engine->stats().transports)
        if (s.transport == first) done_after = s.write.done;
    if (done_after <= done_before) fail_test("after its pause no op went over " + first + " again");
    pass("after " + first + " was restored and its pause (" + std::to_string(kFailoverCooldownMs) + " ms) ended, " +
         std::to_string(done_after - done_before) + " of 16 new WRITEs went over it again");
    (void)g_engine->unregister_memory(src.data());
    (void)g_engine->unregister_memory(back.data());
}

// Rails (tcp.rails) between two hosts joined by two links the script shaped to different rates:
// WRITE throughput over each rail alone and over both (printed, with the ratio to the sum),
// then, over both, one link taken down mid-batch: its slices move to the other rail, every op
// succeeds and every byte is read back; after the link is back and its pause over, it carries
// traffic again (the script checks its byte counters).
double write_rate(Engine &e, const Target &t, uint8_t *src, std::chrono::milliseconds span) {
    constexpr uint64_t kBatch = 32, kInFlight = 4;
    std::vector<Request> reqs;
    for (uint64_t i = 0; i < kBatch; ++i)
        reqs.push_back({Opcode::Write, src + i * kMiB, t.seg, t.base + i * kMiB, kMiB, ""});
    std::vector<BatchId> flying;
    uint64_t bytes = 0;
    auto start = Clock::now();
    while (Clock::now() - start < span || !flying.empty()) {
        while (flying.size() < kInFlight && Clock::now() - start < span) {
            auto b = e.submit(reqs);
            if (!b) fail_test("submit: " + b.error().message);
            flying.push_back(*b);
        }
        if (auto w = e.wait(flying.front(), std::chrono::seconds(30)); !w) fail_test("wait: " + w.error().message);
        (void)e.free_batch(flying.front());
        flying.erase(flying.begin());
        bytes += kBatch * kMiB;
    }
    return static_cast<double>(bytes) / seconds_since(start) / 1e6;
}

uint64_t tx_bytes(const std::string &dev) {
    std::ifstream f("/sys/class/net/" + dev + "/statistics/tx_bytes");
    uint64_t n = 0;
    if (!(f >> n)) fail_test("cannot read the byte counter of " + dev);
    return n;
}

void scenario_rails(const Host &host, const Config &base, const std::string &rail1, const std::string &rail2,
                    const std::string &rail2_dev) {
    constexpr uint64_t kOps = 256;
    std::vector<uint8_t> src(kOps * kMiB), back(kOps * kMiB);
    for (uint64_t i = 0; i < src.size(); ++i) src[i] = written_pattern(i, 5);
    auto engine_with = [&](const std::string &rails) {
        Config cfg = base;
        cfg["tcp.rails"] = rails;
        auto e = Engine::create(cfg);
        if (!e) fail_test("engine with tcp.rails=" + rails + ": " + e.error().message);
        if (auto r = (*e)->register_memory(src.data(), src.size()); !r) fail_test(r.error().message);
        if (auto r = (*e)->register_memory(back.data(), back.size()); !r) fail_test(r.error().message);
        return std::move(*e);
    };
    auto open = [&](Engine &e) {
        auto seg = e.open_segment(host.name);
        if (!seg) fail_test("open " + host.name + ": " + seg.error().message);
        auto regions = e.segment_regions(*seg);
        if (!regions || regions->empty() || regions->front().length < kOps * kMiB)
            fail_test(host.name + " has no region of " + std::to_string(kOps) + " MiB");
        return Target{host, *seg, regions->front().addr, regions->front().length};
    };
    const auto span = std::chrono::milliseconds(1500);
    double rate[3];
    const std::string names[3] = {rail1, rail2, rail1 + "," + rail2};
    for (int k = 0; k < 3; ++k) {
        auto e = engine_with(names[k]);
        Target t = open(*e);
        (void)write_rate(*e, t, src.data(), std::chrono::milliseconds(300));  // connect, learn the rails
        rate[k] = write_rate(*e, t, src.data(), span);
        say("  WRITE 1 MiB, 4 x 32 in flight, tcp.rails=" + names[k] + ": " + std::to_string(int(rate[k])) + " MB/s");
    }
    char summary[200];
    std::snprintf(summary, sizeof summary, "both rails %.0f MB/s = %.2fx the sum of each alone (%.0f + %.0f MB/s)",
                  rate[2], rate[2] / (rate[0] + rate[1]), rate[0], rate[1]);
    pass(std::string("rails of different rates measured: ") + summary);
    // Equal rails: the script shapes rail 2 like rail 1.
    cue("equal-rails");
    for (int k = 1; k < 3; ++k) {
        auto e = engine_with(names[k]);
        Target t = open(*e);
        (void)write_rate(*e, t, src.data(), std::chrono::milliseconds(300));
        rate[k] = write_rate(*e, t, src.data(), span);
        say("  equal rails, tcp.rails=" + names[k] + ": " + std::to_string(int(rate[k])) + " MB/s");
    }
    std::snprintf(summary, sizeof summary, "both equal rails %.0f MB/s = %.2fx one alone (%.0f MB/s)", rate[2],
                  rate[2] / rate[1], rate[1]);
    pass(std::string("equal rails measured: ") + summary);

    // Rail 2 fails under 1,000 WRITEs of 1 MiB (over the 256 MiB region again and again, the
    // same bytes to the same place): its link taken down, then, separately, every packet on it
    // dropped (a tc filter: the black hole netem's 100% loss would make). No op may fail, every
    // byte must read back, and once the rail is back and its pause over it carries traffic again.
    auto e = engine_with(names[2]);
    Target t = open(*e);
    (void)write_rate(*e, t, src.data(), std::chrono::milliseconds(300));
    constexpr uint64_t kFailOps = 1000;
    std::vector<Request> writes;
    for (uint64_t i = 0; i < kFailOps; ++i)
        writes.push_back({Opcode::Write, src.data() + (i % kOps) * kMiB, t.seg, t.base + (i % kOps) * kMiB, kMiB, ""});
    for (const std::string how : {"down", "blackhole"}) {
        std::memset(back.data(), 0, back.size());
        CutRun run = run_and_cut(*e, writes, "rail-" + how);
        auto b = &run.batch;
        const EndTimes &times = *run.times;
        const double cued_at = run.cued_at, down_at = run.cut_at;
        const auto cut_at =
            run.start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(down_at));
        say("  throughput per 100 ms (MB/s), rail 2 " + how + " between " + fmt_s(cued_at) + " and " + fmt_s(down_at) +
            ":");
        say("  " + times.per_100ms());
        double held = times.sustained_from(down_at, 0.9 * rate[0]);
        char recovered[160];
        std::snprintf(
            recovered, sizeof recovered,
            "throughput held >= 0.9x rail 1 alone (%.0f MB/s) from %.0f-%.0f ms after the cut (op_timeout_ms 300)",
            0.9 * rate[0], (held - down_at) * 1e3, (held - cued_at) * 1e3);
        if (held >= 0) say(std::string("  ") + recovered);
        auto w = e->wait(*b, std::chrono::seconds(60));
        if (!w) fail_test(std::to_string(kFailOps) + " WRITEs with rail 2 " + how + " mid-batch: " + w.error().message);
        double all_done = seconds_since(cut_at);
        (void)e->free_batch(*b);
        if (auto r = run_on(*e, {{Opcode::Read, back.data(), t.seg, t.base, kOps * kMiB, ""}}); !r)
            fail_test("read back: " + r.error().message);
        if (std::memcmp(src.data(), back.data(), src.size()) != 0) fail_test("bytes written did not read back equal");
        pass("rail 2 " + how + " mid-batch (" + std::to_string(kFailOps) +
             " x 1 MiB WRITEs): every op succeeded, the "
             "last " +
             fmt_s(all_done) + " after the cut; every byte read back");
        // The read back may have probed the rail while it was still down (one more failure in a
        // row: a longer pause). Once it is back, writes go over it again within its pause.
        cue("rail-up");
        auto up_at = Clock::now();
        uint64_t before = tx_bytes(rail2_dev), sent = 0;
        while ((sent = tx_bytes(rail2_dev) - before) < 20000000 && Clock::now() - up_at < std::chrono::seconds(12))
            (void)write_rate(*e, t, src.data(), std::chrono::milliseconds(250));
        if (sent < 20000000)
            fail_test("rail 2 sent " + std::to_string(sent) + " bytes in the 12 s after it came back: not used again");
        pass("rail 2 carried " + std::to_string(sent / 1000000) + " MB again " + fmt_s(seconds_since(up_at)) +
             " after it came back (its pause: 1 s, doubled on each failure in a row)");
    }
}
