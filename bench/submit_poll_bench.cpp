// Google Benchmark: what one op costs the engine (submit + completion), without bandwidth in the
// way: 64-byte READs over the in-process example transport (engine overhead alone) and over
// tcp.so on loopback (engine + transport + one round trip).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <vector>

#include "ferry/engine.hpp"

namespace {

struct Pair {
    std::unique_ptr<ferry::Engine> target, initiator;
    std::vector<uint8_t> remote = std::vector<uint8_t>(1 << 20), local = std::vector<uint8_t>(1 << 20);
    ferry::SegmentId seg = 0;

    explicit Pair(const std::string &transport) {
        ferry::Config c{{"plugin_path", FERRY_BENCH_PLUGIN_PATH}, {"plugins", transport}};
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
    for (auto _ : state) {
        auto b = p.initiator->submit(reqs);
        if (!b || !p.initiator->wait(*b)) {
            state.SkipWithError("transfer failed");
            break;
        }
        (void)p.initiator->free_batch(*b);
    }
    state.SetItemsProcessed(state.iterations() * batch);
    state.SetLabel(std::string(transport) + ", ops/s = per-op cost");
}

}  // namespace

// Wall time (UseRealTime): the transports' work runs on their own threads.
BENCHMARK_CAPTURE(submit_and_wait, example, "example")->Arg(1)->Arg(32)->Arg(128)->UseRealTime();
BENCHMARK_CAPTURE(submit_and_wait, tcp, "tcp")->Arg(1)->Arg(32)->Arg(128)->UseRealTime();
BENCHMARK_MAIN();
