// Google Benchmark: what one op costs the engine (submit + completion), without bandwidth in the
// way: 64-byte READs over the in-process example transport (engine overhead alone) and over
// tcp.so on loopback (engine + transport + one round trip). The shm cases (wall time) run two
// engines of this process over shm.so's real socket and serving side: 64-byte READs and WRITEs,
// adjacent in memory or 4 KiB apart ("scattered", so no two ops share a page).
// FERRY_BENCH_SHM_PLUGIN_DIR / FERRY_BENCH_TCP_PLUGIN_DIR, when set, are searched first for
// shm.so / tcp.so: another build's plugin (a baseline).
// The submit_and_wait cases also report switches_per_batch: context switches of all of this
// process's threads (both engines: submitting thread, reactors) per batch, from /proc.
#include <benchmark/benchmark.h>

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/engine.hpp"

namespace {

struct Pair {
    std::unique_ptr<ferry::Engine> target, initiator;
    std::vector<uint8_t> remote = std::vector<uint8_t>(1 << 20), local = std::vector<uint8_t>(1 << 20);
    ferry::SegmentId seg = 0;

    explicit Pair(const std::string &transport) {
        std::string path = FERRY_BENCH_PLUGIN_PATH;
        if (const char *d = std::getenv("FERRY_BENCH_SHM_PLUGIN_DIR"); d && *d && transport == "shm")
            path = std::string(d) + ":" + path;
        if (const char *d = std::getenv("FERRY_BENCH_TCP_PLUGIN_DIR"); d && *d && transport == "tcp")
            path = std::string(d) + ":" + path;
        ferry::Config c{{"plugin_path", path}, {"plugins", transport}};
        auto t = ferry::Engine::create(c);
        auto i = ferry::Engine::create(c);
        if (!t || !i) std::abort();
        target = std::move(*t);
        initiator = std::move(*i);
        if (!target->register_memory(remote.data(), remote.size()) ||
            !initiator->register_memory(local.data(), local.size()))
            std::abort();
        seg = *initiator->open_segment(target->segment_name());
    }
};

// Voluntary + involuntary context switches of every thread of this process so far.
double context_switches() {
    double total = 0;
    DIR *d = opendir("/proc/self/task");
    if (d == nullptr) return 0;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string path = std::string("/proc/self/task/") + e->d_name + "/status";
        FILE *f = fopen(path.c_str(), "r");
        if (f == nullptr) continue;
        char line[256];
        unsigned long long v;
        while (fgets(line, sizeof line, f) != nullptr)
            if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
                sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1)
                total += static_cast<double>(v);
        fclose(f);
    }
    closedir(d);
    return total;
}

void submit_and_wait(benchmark::State &state, const char *transport) {
    Pair p(transport);
    const size_t batch = static_cast<size_t>(state.range(0));
    std::vector<ferry::Request> reqs(batch);
    for (size_t i = 0; i < batch; ++i)
        reqs[i] = {ferry::Opcode::Read,
                   p.local.data() + i * 64,
                   p.seg,
                   reinterpret_cast<uintptr_t>(p.remote.data()) + i * 64,
                   64,
                   ""};
    const double switches_before = context_switches();
    for (auto _ : state) {
        auto b = p.initiator->submit(reqs);
        if (!b || !p.initiator->wait(*b)) {
            state.SkipWithError("transfer failed");
            break;
        }
        (void)p.initiator->free_batch(*b);
    }
    state.counters["switches_per_batch"] =
        (context_switches() - switches_before) / static_cast<double>(std::max<int64_t>(1, state.iterations()));
    state.SetItemsProcessed(state.iterations() * batch);
    state.SetLabel(std::string(transport) + ", ops/s = per-op cost");
}

// shm.so: args are the batch and the distance between ops (64: adjacent, 4096: one page each).
void shm_ops(benchmark::State &state, ferry::Opcode opcode) {
    Pair p("shm");
    const size_t batch = static_cast<size_t>(state.range(0)), stride = static_cast<size_t>(state.range(1));
    std::vector<ferry::Request> reqs(batch);
    for (size_t i = 0; i < batch; ++i)
        reqs[i] = {opcode, p.local.data() + i * stride,
                   p.seg,  reinterpret_cast<uintptr_t>(p.remote.data()) + i * stride,
                   64,     ""};
    for (auto _ : state) {
        auto b = p.initiator->submit(reqs);
        if (!b || !p.initiator->wait(*b)) {
            state.SkipWithError("transfer failed");
            break;
        }
        (void)p.initiator->free_batch(*b);
    }
    state.SetItemsProcessed(state.iterations() * batch);
    state.SetLabel(std::string("shm ") + (opcode == ferry::Opcode::Read ? "READ" : "WRITE") +
                   (stride == 64 ? " adjacent" : " scattered") + ", wall time per op = 1 / (ops/s)");
}

}  // namespace

// Wall time (UseRealTime): the transports' work runs on their own threads.
BENCHMARK_CAPTURE(submit_and_wait, example, "example")->Arg(1)->Arg(32)->Arg(128)->UseRealTime();
BENCHMARK_CAPTURE(submit_and_wait, tcp, "tcp")->Arg(1)->Arg(32)->Arg(128)->UseRealTime();
BENCHMARK_CAPTURE(shm_ops, read, ferry::Opcode::Read)->ArgsProduct({{1, 128}, {64, 4096}})->UseRealTime()->MinTime(0.5);
BENCHMARK_CAPTURE(shm_ops, write, ferry::Opcode::Write)
    ->ArgsProduct({{1, 128}, {64, 4096}})
    ->UseRealTime()
    ->MinTime(0.5);
BENCHMARK_MAIN();
