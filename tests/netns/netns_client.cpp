// ferry_netns_client: the initiator host of the multi-host tests (tests/netns/netns_test.sh).
// It runs inside its own network namespace and talks to target hosts in others, with etcd as
// metadata, over every transport it is given (tcp, efa). Each scenario prints one PASS line per
// requirement it checked, or a FAIL line and exits 1; it waits for the script's cues on stdin.
//
//   ferry_netns_client <metadata url> <own ip> <transports> <scenario> <name=ip>...
//   scenarios: transfer A=ip C=ip | kill A=ip C=ip | link A=ip | etcd A=ip D=ip |
//              failover-tcp F=ip | failover-efa F=ip (transports tcp,efa: the named one first) |
//              rails <ip:port>=ip <own rail ip> <own rail ip> (metadata P2PHANDSHAKE)
#include "netns_util.hpp"

namespace {

// Timeouts the client's transports run with; the scenarios' limits are derived from them.
constexpr int kOpTimeoutMs = 3000;
constexpr int kConnectTimeoutMs = 2000;
constexpr int kLeaseTtlS = 3;
// Slack on top of a configured timeout before a late failure counts as a bug: generous, because
// CI machines are small and busy, but far below "never".
constexpr auto kSlack = std::chrono::seconds(12);

// Reads the target's own pattern, then writes a pattern of ours over `transport` and reads it
// back: every byte of both directions is checked.
void verify_transfers(const Target &t, size_t transport) {
    const std::string &tr = g_transports[transport];
    auto r = run({{Opcode::Read, g_local.data(), t.seg, t.base, kPatternBytes, tr}});
    if (!r) fail_test("read " + t.host.name + " over " + tr + ": " + r.error().message);
    for (uint64_t i = 0; i < kPatternBytes; ++i)
        if (g_local[i] != test::peer_pattern(i))
            fail_test("byte " + std::to_string(i) + " read from " + t.host.name + " over " + tr + " is wrong");
    uint8_t *out = g_local.data() + 8 * kMiB, *back = g_local.data() + 16 * kMiB;
    for (uint64_t i = 0; i < kWriteBytes; ++i) out[i] = written_pattern(i, transport);
    std::memset(back, 0, kWriteBytes);
    const uint64_t remote = t.base + kWriteWindow + transport * kWriteBytes;
    if (auto w = run({{Opcode::Write, out, t.seg, remote, kWriteBytes, tr}}); !w)
        fail_test("write to " + t.host.name + " over " + tr + ": " + w.error().message);
    if (auto rb = run({{Opcode::Read, back, t.seg, remote, kWriteBytes, tr}}); !rb)
        fail_test("read back from " + t.host.name + " over " + tr + ": " + rb.error().message);
    if (std::memcmp(out, back, kWriteBytes) != 0)
        fail_test("bytes written to " + t.host.name + " over " + tr + " did not read back equal");
}

bool eventually(const std::function<bool()> &check, std::chrono::seconds limit) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
        if (check()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
}

bool registered(const std::string &name) {
    auto s = g_engine->open_segment(name);
    if (!s) return false;
    auto regions = g_engine->segment_regions(*s);
    (void)g_engine->close_segment(*s);
    return regions && !regions->empty();
}

std::vector<std::string> split(const std::string &s, char sep) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string part; std::getline(in, part, sep);)
        if (!part.empty()) out.push_back(part);
    return out;
}

void scenario_transfer(const std::vector<Host> &hosts) {
    for (const Host &h : hosts) {
        Target t = open_target(h);
        for (size_t k = 0; k < g_transports.size(); ++k) {
            verify_transfers(t, k);
            pass("transfer over " + g_transports[k] + " to " + h.name + " (" + h.ip +
                 ") across namespaces: 1 MiB read and 4 MiB written, every byte checked");
        }
    }
    // Connections are open now: the script checks which addresses every socket uses.
    cue("sockets-checked");
}

void scenario_kill(const Host &live, const Host &doomed_host) {
    Target a = open_target(live), c = open_target(doomed_host);
    // 8 GiB per transport: seconds of work, so the kill lands mid-transfer.
    std::vector<BatchId> batches;
    for (size_t k = 0; k < g_transports.size(); ++k) {
        std::vector<Request> big;
        for (uint64_t i = 0; i < 8192; ++i)
            big.push_back({Opcode::Write, g_local.data() + (i % 32) * kMiB, c.seg, c.base + (i % 32) * kMiB, kMiB,
                           g_transports[k]});
        auto b = g_engine->submit(big);
        if (!b) fail_test("submit to " + c.host.name + " over " + g_transports[k] + ": " + b.error().message);
        batches.push_back(*b);
    }
    // The kill must land mid-transfer: the last write of every batch is still pending now.
    for (size_t k = 0; k < g_transports.size(); ++k) {
        auto st = g_engine->status(batches[k], 8191);
        if (!st || st->state != OpState::Pending)
            fail_test("the writes over " + g_transports[k] + " ended before the kill (" +
                      (st ? std::string(st->state == OpState::Done ? "done" : "failed: " + st->message)
                          : st.error().message) +
                      ")");
    }
    cue("killed");
    auto killed_at = Clock::now();
    for (size_t k = 0; k < g_transports.size(); ++k) {
        const std::string &tr = g_transports[k];
        auto w = g_engine->wait(batches[k], std::chrono::seconds(30));
        if (w) fail_test("8 GiB of writes over " + tr + " to a host killed mid-transfer all succeeded");
        if (w.error().code == -ETIMEDOUT && w.error().message.starts_with("wait:"))
            fail_test("ops over " + tr + " to the killed host were still in flight 30 s after the kill");
        if (w.error().message.find(doomed_host.ip) == std::string::npos)
            fail_test("the error over " + tr + " does not name the killed peer " + doomed_host.ip + ": " +
                      w.error().message);
        (void)g_engine->free_batch(batches[k]);
        pass("in-flight ops over " + tr + " to the killed host failed " + fmt_s(seconds_since(killed_at)) +
             " after the kill (code " + std::to_string(w.error().code) + "): " + w.error().message);
    }
    for (size_t k = 0; k < g_transports.size(); ++k) {
        verify_transfers(a, k);
        pass("the other host " + live.name + " still serves over " + g_transports[k] + ": every byte checked");
    }
    (void)g_engine->close_segment(c.seg);
    const auto limit = std::chrono::seconds(kLeaseTtlS) + kSlack;
    bool gone = eventually(
        [&] {
            auto s = g_engine->open_segment(doomed_host.name);
            if (s) (void)g_engine->close_segment(*s);
            return !s && s.error().code == -ENOENT;
        },
        std::chrono::duration_cast<std::chrono::seconds>(limit));
    if (!gone)
        fail_test("the killed host's segment was still in etcd " + fmt_s(seconds_since(killed_at)) +
                  " after the kill (lease TTL " + std::to_string(kLeaseTtlS) + " s)");
    pass("the killed host's segment left etcd " + fmt_s(seconds_since(killed_at)) + " after the kill (lease TTL " +
         std::to_string(kLeaseTtlS) + " s)");
}

void scenario_link(const Host &host) {
    Target a = open_target(host);
    for (size_t k = 0; k < g_transports.size(); ++k) verify_transfers(a, k);
    cue("cut");
    // One 16 MiB read per transport, all in flight over the cut link at once.
    std::vector<BatchId> batches;
    auto start = Clock::now();
    for (size_t k = 0; k < g_transports.size(); ++k) {
        std::vector<Request> read{
            {Opcode::Read, g_local.data() + k * 16 * kMiB, a.seg, a.base, 16 * kMiB, g_transports[k]}};
        auto b = g_engine->submit(read);
        if (!b) fail_test("submit over " + g_transports[k] + " across the cut link: " + b.error().message);
        batches.push_back(*b);
    }
    for (size_t k = 0; k < g_transports.size(); ++k) {
        const std::string &tr = g_transports[k];
        auto w = g_engine->wait(batches[k], std::chrono::milliseconds(kOpTimeoutMs) + kSlack);
        double took = seconds_since(start);
        if (w) fail_test("a read over " + tr + " across the cut link succeeded");
        if (w.error().message.starts_with("wait:"))
            fail_test("a read over " + tr + " across the cut link had not failed " + fmt_s(took) +
                      " later (op_timeout_ms " + std::to_string(kOpTimeoutMs) + ")");
        if (w.error().code != -ETIMEDOUT)
            fail_test("a read over " + tr + " across the cut link failed with code " + std::to_string(w.error().code) +
                      " instead of a timeout: " + w.error().message);
        if (w.error().message.find(host.ip) == std::string::npos)
            fail_test("the timeout over " + tr + " does not name the peer " + host.ip + ": " + w.error().message);
        (void)g_engine->free_batch(batches[k]);
        pass("over " + tr + " across the cut link the op timed out after " + fmt_s(took) + " (op_timeout_ms " +
             std::to_string(kOpTimeoutMs) + "): " + w.error().message);
    }
    // An outage longer than every timeout: the transports' own reconnect attempts (bounded by
    // connect_timeout_ms) give up before the link is back.
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * kConnectTimeoutMs));
    // The script restores the link and waits until host b reaches host a again, so the first
    // new op on every transport must succeed: no retries here.
    cue("restored");
    for (size_t k = 0; k < g_transports.size(); ++k) {
        const std::string &tr = g_transports[k];
        auto t0 = Clock::now();
        if (tr == "efa") {
            // libfabric's tcp provider reconnects on its own schedule: a connect it began while
            // the link was down waits out TCP's SYN backoff (1, 2, 4, 8 s...), so ops may fail as
            // unreachable for a while. Bounded, and every failure is shown. (Real EFA has no
            // connections.)
            const auto limit = std::chrono::seconds(30);
            int failures = 0;
            for (;;) {
                auto r = run({{Opcode::Read, g_local.data(), a.seg, a.base, 4096, tr}});
                if (r) break;
                ++failures;
                say("  efa not reconnected yet after " + fmt_s(seconds_since(t0)) + ": " + r.error().message);
                if (Clock::now() - t0 > limit)
                    fail_test("ops over efa still fail " + fmt_s(seconds_since(t0)) + " after the link came back");
                std::this_thread::sleep_for(std::chrono::milliseconds(500));
            }
            verify_transfers(a, k);
            pass("after the link came back new ops over efa succeeded " + fmt_s(seconds_since(t0)) + " later, after " +
                 std::to_string(failures) + " failed attempts while the tcp provider reconnected: every byte checked");
            continue;
        }
        verify_transfers(a, k);
        pass("after the link came back the first new ops over " + tr + " succeeded (" + fmt_s(seconds_since(t0)) +
             "): every byte checked");
    }
}

void scenario_etcd(const Host &survivor, const Host &late) {
    // The script stopped etcd, started `late` while it was down (it must retry and say so),
    // then started etcd again with no data.
    cue("etcd-restarted");
    // Engines notice the lost lease on their next keep-alive (a third of the TTL) and register
    // again; the script has already waited for D's start, so this is normally immediate.
    const auto limit = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::seconds(kLeaseTtlS) + kSlack);
    if (!eventually([&] { return registered(survivor.name); }, limit))
        fail_test(survivor.name + " never registered again after etcd restarted without its data");
    pass(survivor.name + ", running through the etcd restart, registered again in the new etcd");
    if (!registered(late.name)) fail_test(late.name + ", started while etcd was down, is not registered");
    pass(late.name + ", started while etcd was down, is registered");
    for (const Host &h : {survivor, late}) {
        Target t = open_target(h);
        for (size_t k = 0; k < g_transports.size(); ++k) {
            verify_transfers(t, k);
            pass("new open of " + h.name + " after the etcd restart, transfer over " + g_transports[k] +
                 ": every byte checked");
        }
    }
    // The script checks that this engine's own segment is back in etcd too.
    cue("keys-checked");
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 6) {
        std::fprintf(stderr, "usage: ferry_netns_client <metadata> <own ip> <transports> <scenario> <name=ip>...\n");
        return 2;
    }
    std::string metadata = argv[1], ip = argv[2], scenario = argv[4];
    g_transports = split(argv[3], ',');
    std::vector<Host> hosts;
    std::vector<std::string> extra;  // rails: this host's rail addresses
    for (int i = 5; i < argc; ++i) {
        std::string a = argv[i];
        if (scenario == "rails" && i > 5) {
            extra.push_back(a);
            continue;
        }
        auto eq = a.find('=');
        if (eq == std::string::npos) fail_test("argument '" + a + "' is not name=ip");
        hosts.push_back({a.substr(0, eq), a.substr(eq + 1)});
    }
    Config cfg{{"plugins", argv[3]},
               {"metadata", metadata},
               {"local_server_name", "initiator-" + scenario},
               {"etcd_lease_ttl_s", std::to_string(kLeaseTtlS)},
               {"local_ip", ip},
               {"host_id", "host-b"},
               {"tcp.bind_ip", ip},
               {"tcp.op_timeout_ms", std::to_string(kOpTimeoutMs)},
               {"tcp.connect_timeout_ms", std::to_string(kConnectTimeoutMs)}};
    for (const auto &t : g_transports)
        if (t == "efa") {
            // libfabric's tcp provider, bound to this namespace's address.
            cfg["efa.provider"] = "tcp";
            cfg["efa.node"] = ip;
            cfg["efa.op_timeout_ms"] = std::to_string(kOpTimeoutMs);
            cfg["efa.connect_timeout_ms"] = std::to_string(kConnectTimeoutMs);
        }
    std::string first, second;
    if (scenario.starts_with("failover-")) {
        first = scenario.substr(9);
        second = first == "tcp" ? "efa" : "tcp";
        cfg["protocols"] = first + "," + second;
        cfg["tcp.op_timeout_ms"] = std::to_string(kTcpStallMs);
        cfg["efa.op_timeout_ms"] = std::to_string(kEfaOpTimeoutMs);
        cfg["path_cooldown_ms"] = std::to_string(kFailoverCooldownMs);
    }
    if (scenario == "rails") {
        cfg.erase("local_server_name");  // P2PHANDSHAKE: named by its control server's address
        cfg["tcp.op_timeout_ms"] = "300";
        if (hosts.size() != 1 || extra.size() != 3)
            fail_test("rails: <ip:port>=ip <rail ip> <rail ip> <rail 2's device>");
        scenario_rails(hosts[0], cfg, extra[0], extra[1], extra[2]);
        say("DONE " + scenario);
        return 0;
    }
    auto e = Engine::create(cfg);
    if (!e) fail_test("engine: " + e.error().message);
    g_engine = std::move(*e);
    if (auto r = g_engine->register_memory(g_local.data(), g_local.size()); !r) fail_test(r.error().message);

    if (scenario == "transfer" && !hosts.empty()) scenario_transfer(hosts);
    else if (scenario == "kill" && hosts.size() == 2) scenario_kill(hosts[0], hosts[1]);
    else if (scenario == "link" && hosts.size() == 1) scenario_link(hosts[0]);
    else if (scenario == "etcd" && hosts.size() == 2) scenario_etcd(hosts[0], hosts[1]);
    else if (!first.empty() && hosts.size() == 1 && g_transports.size() == 2)
        scenario_failover(hosts[0], first, second);
    else fail_test("unknown scenario or wrong number of hosts: " + scenario);
    g_engine.reset();  // before static destruction: its threads still log while stopping
    say("DONE " + scenario);
    return 0;
}
