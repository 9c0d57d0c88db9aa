// Registration at scale: how long registering N regions takes, what a peer's open_segment (the
// descriptor fetch) costs, and what an op to a random one of N regions costs over one to a single
// region over tcp.so (loopback: noisy, the transport dominates). Then the per-op lookups alone,
// as submit() does them on the engine's own structures: the local region (Engine::Impl::regions),
// the remote region and its imported handle (RemoteSegment::rows) and the route, next to main's
// structures (std::map, find_region, std::map). Plain timers, wall time; thread CPU time for the
// lookups.
//
//   registration_bench [--plugin-path DIR[:DIR]] [--plugins tcp] [--regions 1000,10000,100000]
//                      [--budget-s 60] [--ops 200000] [--etcd HOST:PORT] [--batch]
//                      [--registration-only] [--no-unregister] [--lookups-only]
//
// --etcd publishes both engines through that etcd (under a prefix of this process's own) instead
// of P2PHANDSHAKE; --batch registers the N regions with one register_memory_batch call and
// unregisters them with one unregister_memory_batch call (P2PHANDSHAKE too); --registration-only
// stops after register, open_segment and unregister (no ops, no lookup figures); --no-unregister
// leaves the regions to the engine's destruction (a baseline without unregister_memory_batch at
// 100k would take minutes one by one over etcd); --lookups-only prints the per-op lookup figures
// alone (no engines, no transport). bench/etcd_registration.sh runs it against an
// etcd of its own, this tree and a baseline in one call.
//
// A register loop that runs past --budget-s stops there and says how far it got (the quadratic
// code needs minutes at 100k).
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_impl.hpp"
#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "metadata/descriptor.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

constexpr size_t kRegion = 64;  // bytes per region: small, so 100k fit in 6.4 MB
constexpr size_t kBatch = 128;

struct Args {
    std::string plugin_path = FERRY_BENCH_PLUGIN_PATH;
    std::string plugins = "tcp";
    std::vector<size_t> counts{1000, 10000, 100000};
    double budget_s = 60;
    size_t ops = 200000;
    std::string etcd;  // host:port; empty: P2PHANDSHAKE
    bool batch = false;
    bool registration_only = false;  // no ops, no lookup figures
    bool no_unregister = false;
    bool lookups_only = false;  // the lookup figures alone
};

// Per-op wall time of READ batches whose ops hit the regions `pick` chooses.
template <class Pick>
double per_op_ns(ferry::Engine &initiator, ferry::SegmentId seg, uint8_t *local, uint64_t remote_base, size_t ops,
                 Pick pick) {
    std::vector<ferry::Request> reqs(kBatch);
    size_t done = 0;
    auto t0 = Clock::now();
    while (done < ops) {
        for (size_t i = 0; i < kBatch; ++i)
            reqs[i] = {ferry::Opcode::Read, local + i * 8, seg, remote_base + pick() * kRegion, 8, ""};
        auto b = initiator.submit(reqs);
        if (!b) {
            fprintf(stderr, "submit failed: %s\n", b.error().message.c_str());
            std::exit(1);
        }
        if (auto w = initiator.wait(*b); !w) {
            fprintf(stderr, "wait failed: %s\n", w.error().message.c_str());
            std::exit(1);
        }
        (void)initiator.free_batch(*b);
        done += kBatch;
    }
    return seconds_since(t0) * 1e9 / static_cast<double>(done);
}

int run(const Args &a, size_t n) {
    ferry::Config c{{"plugin_path", a.plugin_path}, {"plugins", a.plugins}};
    ferry::Config tc = c;
    if (!a.etcd.empty()) {
        std::string url = "etcd://" + a.etcd + "/ferry-bench-" + std::to_string(getpid()) + "-" + std::to_string(n);
        c["metadata"] = tc["metadata"] = url;
        tc["local_server_name"] = "target";
        c["local_server_name"] = "initiator";
    }
    auto target = ferry::Engine::create(tc);
    auto initiator = ferry::Engine::create(c);
    if (!target || !initiator) {
        fprintf(stderr, "engine: %s\n", (!target ? target.error() : initiator.error()).message.c_str());
        return 1;
    }
    std::vector<uint8_t> remote(n * kRegion), local(kBatch * 8);
    if (!(*initiator)->register_memory(local.data(), local.size())) return 1;

    // The batch calls' arguments exist before the clock starts, as a caller's would.
    std::vector<ferry::MemoryRange> ranges;
    std::vector<void *> addrs;
    for (size_t i = 0; a.batch && i < n; ++i) {
        ranges.push_back({remote.data() + i * kRegion, kRegion});
        addrs.push_back(remote.data() + i * kRegion);
    }
    auto t0 = Clock::now();
    size_t registered = 0;
    if (a.batch) {
        if (auto r = (*target)->register_memory_batch(ranges); !r) {
            fprintf(stderr, "register_memory_batch: %s\n", r.error().message.c_str());
            return 1;
        }
        registered = n;
    }
    for (; registered < n; ++registered) {
        if (auto r = (*target)->register_memory(remote.data() + registered * kRegion, kRegion); !r) {
            fprintf(stderr, "register_memory: %s\n", r.error().message.c_str());
            return 1;
        }
        if ((registered & 255) == 0 && seconds_since(t0) > a.budget_s) break;
    }
    double reg_s = seconds_since(t0);
    if (registered < n) {
        printf(
            "%7zu regions: register STOPPED after %.1f s at %zu regions (%.2f us/region at the end); no lookup figures\n",
            n, reg_s, registered, reg_s * 1e6 / static_cast<double>(registered));
        return 0;
    }

    t0 = Clock::now();
    auto seg = (*initiator)->open_segment((*target)->segment_name());
    double open_ms = seconds_since(t0) * 1e3;
    if (!seg) {
        fprintf(stderr, "open_segment: %s\n", seg.error().message.c_str());
        return 1;
    }
    uint64_t base = reinterpret_cast<uintptr_t>(remote.data());
    double one = 0, random = 0;
    if (!a.registration_only) {
        // Touch every region once so imports are made before timing.
        size_t next = 0;
        per_op_ns(**initiator, *seg, local.data(), base, ((n + kBatch - 1) / kBatch) * kBatch,
                  [&] { return next++ % n; });

        std::mt19937_64 rng(42);
        std::uniform_int_distribution<size_t> any(0, n - 1);
        one = per_op_ns(**initiator, *seg, local.data(), base, a.ops, [] { return size_t{0}; });
        random = per_op_ns(**initiator, *seg, local.data(), base, a.ops, [&] { return any(rng); });
    }

    // unregister_memory_batch is C API 5; built against an older engine (a baseline), regions go
    // one by one.
#if FERRY_C_API_VERSION >= 5
    const bool batch_unregister = a.batch;
#else
    const bool batch_unregister = false;
#endif
    double unreg_s = 0;
    t0 = Clock::now();
    if (batch_unregister && !a.no_unregister) {
#if FERRY_C_API_VERSION >= 5
        if (auto r = (*target)->unregister_memory_batch(addrs); !r) {
            fprintf(stderr, "unregister_memory_batch: %s\n", r.error().message.c_str());
            return 1;
        }
#endif
    }
    for (size_t i = 0; i < n && !batch_unregister && !a.no_unregister; ++i)
        if (auto r = (*target)->unregister_memory(remote.data() + i * kRegion); !r) {
            fprintf(stderr, "unregister_memory: %s\n", r.error().message.c_str());
            return 1;
        }
    unreg_s = seconds_since(t0);
    printf("%7zu regions%s: register%s %.3f s (%.2f us/region), open_segment %.2f ms, ", n,
           a.etcd.empty() ? "" : " over etcd", a.batch ? " (one batch)" : "", reg_s,
           reg_s * 1e6 / static_cast<double>(n), open_ms);
    if (a.no_unregister) printf("unregister skipped");
    else printf("unregister%s %.3f s", batch_unregister ? " (one batch)" : "", unreg_s);
    if (!a.registration_only)
        printf(", op to 1 region %.0f ns, to random regions %.0f ns (+%.0f ns lookup)", one, random, random - one);
    printf("\n");
    fflush(stdout);
    return 0;
}

// The lookups of one op, on n regions of 64 bytes, at random regions and in runs of kRun ops to
// the same region, done as submit() does them (core/engine/submit.cpp): the ops of a batch in windows of
// RegionIndex::kMaxMany, each window's local and remote rows looked up together
// (RegionIndex::find_many with a RemoteProbe; an op within a page of the one before it is left
// out), then per op submit's same-region check and route_fast (the route a ready op takes:
// transport, peer, imported handle) on a RemoteSegment built as open_segment and the connector
// build it. Left out, as not lookup: the checks of opcode and length, the batch's allocation,
// grouping and posting.
void lookup_figures(size_t n) {
    constexpr size_t kLookups = 1 << 20;
    constexpr size_t kRun = 16;
    constexpr size_t kMany = ferry::RegionIndex::kMaxMany;
    const uint64_t base = 1ull << 32;
    ferry::RegionIndex local;
    std::map<uint64_t, ferry::LocalRegion> main_local;  // main's type
    ferry::SegmentDescriptor d;
    d.name = "bench";
    d.transports.push_back({"tcp", std::vector<uint8_t>(24, 1)});
    for (size_t i = 0; i < n; ++i) {
        uint64_t a = base + i * kRegion;
        ferry::LocalRegion r{a, kRegion, FERRY_MEM_HOST, -1, 3, {uint64_t{i}}, {std::vector<uint8_t>(24, 2)}};
        main_local.emplace(a, r);
        local.insert(std::move(r));
        d.regions.push_back({a, kRegion, FERRY_MEM_HOST, -1, 3, {{"tcp", std::vector<uint8_t>(24, 2)}}});
    }
    auto decoded = ferry::decode_descriptor(ferry::encode_descriptor(d));
    if (!decoded) std::abort();
    ferry::RemoteSegment seg;
    seg.descriptor = std::move(*decoded);
    seg.peers = {uint64_t{1}};
    std::map<std::pair<size_t, uint64_t>, uint64_t> main_imported;  // main's type
    for (size_t i = 0; i < n; ++i) {
        seg.imported[{0, base + i * kRegion}] = i;
        main_imported[{0, base + i * kRegion}] = i;
    }
    std::string_view names[] = {"tcp"};
    uint64_t caps[] = {FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE | FERRY_CAP_INTER_NODE};
    seg.reindex(names, caps);  // rows, masks and the imports above, as open_segment and a re-read do
    const std::vector<size_t> priority{0};
    std::mt19937_64 rng(7);
    std::vector<uint64_t> addrs(kLookups), runs(kLookups);
    for (auto &a : addrs) a = base + (rng() % n) * kRegion + 8;
    for (size_t i = 0; i < kLookups; i += kRun) {
        uint64_t r = base + (rng() % n) * kRegion;
        for (size_t j = 0; j < kRun; ++j) runs[i + j] = r + (j % 7) * 8;
    }
    // The index is built by the finds that fall back to the map (as in an engine): warm it.
    for (uint64_t a : addrs) (void)local.find(a, 8);

    uint64_t sink = 0;
    // This thread's CPU time: on a shared machine, wall time here measures the other tenants.
    auto cpu_ns = [] {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
    };
    auto time = [&](const std::vector<uint64_t> &which, auto &&one) {
        double best = 1e300;
        for (int round = 0; round < 3; ++round) {  // best of 3
            double t0 = cpu_ns();
            for (uint64_t a : which) sink += one(a);
            best = std::min(best, (cpu_ns() - t0) / kLookups);
        }
        return best;
    };
    // One op's route once its two rows are known (route() with no transport forced).
    auto route = [&](const ferry::LocalRow *lr, size_t row) -> uint64_t {
        ferry::Route r;
        if (!lr || row == ferry::RemoteRows::kNone ||
            !ferry::route_fast(seg, priority, *lr, seg.rows[row], ferry::Opcode::Read, r) ||
            r.need != ferry::Route::Need::Nothing)
            std::abort();
        return *lr->handle(r.transport) + r.peer + r.remote_mem;
    };
    // submit's loop over ops at `which` (local and remote at the same address, 8 bytes each):
    // windows of kMany ops, an op near the one before it left out of the window's lookups.
    auto submit_like = [&](const std::vector<uint64_t> &which, bool check) {
        double best = 1e300;
        uint64_t lens[kMany];
        std::fill(std::begin(lens), std::end(lens), uint64_t{8});
        auto near = [](uint64_t a, uint64_t b) { return (a > b ? a - b : b - a) < 4096; };
        for (int round = 0; round < 3; ++round) {
            double t0 = cpu_ns();
            const ferry::LocalRow *prev_lr = nullptr;
            const ferry::RemoteRow *prev_row = nullptr;
            uint64_t prev = 0;
            for (size_t w = 0; w < which.size(); w += kMany) {
                const ferry::LocalRow *lrs[kMany];
                size_t rows[kMany], slot[kMany], m = 0;
                uint64_t addrs_[kMany];
                for (size_t k = 0; k < kMany; ++k) {
                    if (check && w + k > 0 && near(which[w + k], which[w + k - 1])) {
                        slot[k] = kMany;
                        continue;
                    }
                    slot[k] = m;
                    addrs_[m++] = which[w + k];
                }
                ferry::RegionIndex::RemoteProbe probe{&seg.rows, &seg.descriptor, addrs_, rows};
                local.find_many(addrs_, lens, m, lrs, &probe);
                for (size_t k = 0; k < kMany; ++k) {
                    uint64_t a = which[w + k];
                    if (check && prev_lr && prev_lr->holds(a, 8) && prev_row->holds(a, 8)) {
                        sink += prev;
                        continue;
                    }
                    const ferry::LocalRow *lr = slot[k] < kMany ? lrs[slot[k]] : local.find(a, 8);
                    size_t row = slot[k] < kMany ? rows[slot[k]] : seg.rows.find(seg.descriptor, a, 8);
                    prev = route(lr, row);
                    prev_lr = lr;
                    prev_row = &seg.rows[row];
                    sink += prev;
                }
            }
            best = std::min(best, (cpu_ns() - t0) / kLookups);
        }
        return best;
    };
    auto local_find = [&](uint64_t a) -> uint64_t {
        auto *r = local.find(a, 8);
        return r ? *r->handle(0) : 0;
    };
    auto main_local_find = [&](uint64_t a) -> uint64_t {
        auto it = main_local.upper_bound(a);
        return it == main_local.begin() ? 0 : *std::prev(it)->second.handles[0];
    };
    auto remote_find = [&](uint64_t a) -> uint64_t {
        size_t i = seg.rows.find(seg.descriptor, a, 8);
        return i == ferry::RemoteRows::kNone ? 0 : seg.rows[i].imported[0];
    };
    auto main_remote_find = [&](uint64_t a) -> uint64_t {
        auto *r = seg.descriptor.find_region(a, 8);
        return r ? r->addr + r->key_for("tcp")->key.size() : 0;
    };
    auto main_import_find = [&](uint64_t a) -> uint64_t {
        auto it = main_imported.find({0, a & ~uint64_t{kRegion - 1}});
        return it == main_imported.end() ? 0 : it->second;
    };
    // One op at a time: find, rows.find and route_fast, no window.
    auto one_by_one = [&](uint64_t a) -> uint64_t {
        return route(local.find(a, 8), seg.rows.find(seg.descriptor, a, 8));
    };
    double all_ns = submit_like(addrs, true), unwindowed_ns = time(addrs, one_by_one);
    double local_ns = time(addrs, local_find), remote_ns = time(addrs, remote_find);
    double main_local_ns = time(addrs, main_local_find), main_import_ns = time(addrs, main_import_find);
    double runs_ns = submit_like(runs, true), runs_unchecked_ns = submit_like(runs, false);
    double main_all_ns = time(
        addrs, [&](uint64_t a) -> uint64_t { return main_local_find(a) + main_remote_find(a) + main_import_find(a); });
    printf(
        "%7zu regions: per-op lookups (thread CPU time, best of 3): random regions: all three %.0f ns "
        "(as submit does them: windows of %zu, the same-region check, route_fast; one op at a time %.0f; local row %.0f, "
        "remote row with its import %.0f); "
        "main's structures (std::map local and imported, descriptor find_region) %.0f ns (local %.0f, imported %.0f); "
        "runs of %zu ops to one region: %.0f ns with the check, %.0f ns without%s\n",
        n, all_ns, kMany, unwindowed_ns, local_ns, remote_ns, main_all_ns, main_local_ns, main_import_ns, kRun, runs_ns,
        runs_unchecked_ns, sink == 42 ? " " : "");
    fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s needs a value\n", arg.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (arg == "--plugin-path") a.plugin_path = value();
        else if (arg == "--plugins") a.plugins = value();
        else if (arg == "--budget-s") a.budget_s = std::atof(value().c_str());
        else if (arg == "--ops") a.ops = std::strtoull(value().c_str(), nullptr, 10);
        else if (arg == "--etcd") a.etcd = value();
        else if (arg == "--batch") a.batch = true;
        else if (arg == "--registration-only") a.registration_only = true;
        else if (arg == "--no-unregister") a.no_unregister = true;
        else if (arg == "--lookups-only") a.lookups_only = true;
        else if (arg == "--regions") {
            a.counts.clear();
            std::string list = value();
            for (size_t p = 0; p < list.size();) {
                size_t q = list.find(',', p);
                a.counts.push_back(std::strtoull(list.substr(p, q - p).c_str(), nullptr, 10));
                p = q == std::string::npos ? list.size() : q + 1;
            }
        } else {
            fprintf(stderr,
                    "usage: registration_bench [--plugin-path P] [--plugins example] [--regions 1000,10000,100000] "
                    "[--budget-s 60] [--ops 200000] [--etcd HOST:PORT] [--batch] [--registration-only] "
                    "[--no-unregister] [--lookups-only]\n");
            return 2;
        }
    }
    for (size_t n : a.counts)
        if (n == 0 || (!a.lookups_only && run(a, n) != 0)) return 1;
    if (!a.registration_only)
        for (size_t n : a.counts) lookup_figures(n);
    return 0;
}
