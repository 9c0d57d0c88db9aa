// GPU -> GPU between two processes over the host-only transports (tcp.so, shm.so, efa.so on
// libfabric's tcp provider) on a real NVIDIA GPU: the target (ferry_gpu_test_peer) serves its
// cudaMalloc'd regions through pinned slices (FERRY_CAP_STAGED_DEVICE), this process stages its
// own GPU memory through the initiator pipeline. READ and WRITE are byte-verified, at offsets
// inside registered regions (the initiator's region is itself a sub-buffer of its allocation)
// and with lengths that are no multiple of the slice size; a target killed mid-pipeline fails
// every unfinished op with an error, none hangs, and this side's pinned memory comes back.
// Without a usable CUDA device, or where a transport does not serve device memory (efa.so
// before it has FERRY_CAP_STAGED_DEVICE), a test skips and says why.
#include <gtest/gtest.h>

#include <chrono>
#include <cinttypes>
#include <cstring>
#include <sstream>
#include <thread>

#include "cuda_util.hpp"
#include "ferry/engine.hpp"
#include "ferry/plugin.h"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

constexpr uint64_t kGap = 4096;  // ferry_gpu_test_peer's gap before and between its regions
constexpr uint64_t kSlice = 1 << 20;

struct Transport {
    std::string name;
    Config initiator;                 // this engine
    std::vector<std::string> target;  // ferry_gpu_test_peer's engine options
};

Transport transport_for(const std::string &name) {
    if (name == "efa")
        return {name,
                {{"plugins", "efa"}, {"efa.provider", "tcp"}, {"efa.op_timeout_ms", "10000"}},
                {"efa.provider=tcp", "efa.op_timeout_ms=10000"}};
    return {name, {{"plugins", name}}, {}};
}

class GpuOverHostTransport : public test::CudaEngineTest, public ::testing::WithParamInterface<std::string> {
protected:
    void SetUp() override {
        test::CudaEngineTest::SetUp();
        if (IsSkipped()) return;
        tr_ = transport_for(GetParam());
        Config c = tr_.initiator;
        c["gpu_staging_slice_bytes"] = std::to_string(kSlice);
        auto e = Engine::create(c);
        if (!e && tr_.name == "efa") GTEST_SKIP() << "SKIPPED: efa.so does not load here: " << e.error().message;
        ASSERT_TRUE(e) << e.error().message;
        engine_ = std::move(*e);
        bool staged = false;
        for (auto &t : engine_->transports()) staged |= t.name == tr_.name && (t.caps & FERRY_CAP_STAGED_DEVICE);
        if (!staged)
            GTEST_SKIP() << "SKIPPED: " << tr_.name
                         << ".so does not serve staged device memory (no FERRY_CAP_STAGED_DEVICE)";
    }

    // Starts the GPU target with two regions of `size` bytes; false (and a skip) when it
    // cannot serve them over this transport.
    bool start_peer(uint64_t size) {
        std::vector<std::string> args = {std::to_string(size), "0", tr_.name};
        args.insert(args.end(), tr_.target.begin(), tr_.target.end());
        peer_ = std::make_unique<PeerProcess>(args, FERRY_GPU_TEST_PEER_BIN);
        std::istringstream ready(peer_->ready_line);
        std::string word, segment, a0, a1;
        ready >> word >> segment >> a0 >> a1;
        EXPECT_EQ(word, "READY") << peer_->ready_line;
        if (word != "READY") return false;
        r0_ = std::stoull(a0, nullptr, 16);
        r1_ = std::stoull(a1, nullptr, 16);
        auto seg = engine_->open_segment(segment);
        EXPECT_TRUE(seg) << seg.error().message;
        if (!seg) return false;
        seg_ = *seg;
        return true;
    }

    // What the target holds: region 0 then region 1, as its pattern put them there.
    static std::vector<uint8_t> peer_image(uint64_t size) {
        std::vector<uint8_t> v(2 * size);
        for (uint64_t i = 0; i < size; ++i) {
            v[i] = test::peer_pattern(kGap + i);
            v[size + i] = test::peer_pattern(2 * kGap + size + i);
        }
        return v;
    }
    static std::string sum_line(const std::vector<uint8_t> &v) {
        char want[64];
        snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(v.data(), v.size()));
        return want;
    }

    Transport tr_;
    std::unique_ptr<Engine> engine_;
    std::unique_ptr<PeerProcess> peer_;
    SegmentId seg_{};
    uint64_t r0_ = 0, r1_ = 0;
};

struct Piece {
    uint64_t remote_off, local_off, length;
};

}  // namespace

TEST_P(GpuOverHostTransport, ReadAndWriteSubBuffersMoveEveryByte) {
    // Regions and ops of lengths that are no multiple of the 1 MiB slice (the target's own slice
    // is its default, 4 MiB), at odd offsets inside them.
    const uint64_t size = (9 << 20) + 4099;
    ASSERT_TRUE(start_peer(size));
    const uint64_t alloc = 2 * size + 3 * kGap;
    uint8_t *base = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&base), alloc));
    uint8_t *dev = base + kGap;  // our region: a sub-buffer of the allocation
    const uint64_t local_len = 2 * size;
    ASSERT_TRUE(engine_->register_memory(dev, local_len, {MemoryKind::Cuda, 0}));
    CUDA_OR_DIE(cudaMemset(base, 0xee, alloc));

    const std::vector<Piece> reads = {{0, 0, size},
                                      {13, size + 5, kSlice + 1},
                                      {size - 4097, size + kSlice + 11, 4097},
                                      {(5 << 20) + 3, size + kSlice + 8192, (3 << 20) + 5},
                                      {1, size + (5 << 20), 1}};
    std::vector<Request> reqs;
    for (auto &p : reads)
        reqs.push_back({Opcode::Read, dev + p.local_off, seg_, r0_ + p.remote_off, p.length, tr_.name});
    std::string used;
    auto r = run(*engine_, reqs, &used);
    if (!r && tr_.name == "efa" && r.error().code == -EHOSTUNREACH)
        GTEST_SKIP() << "SKIPPED: the target did not register its GPU memory with efa: " << r.error().message;
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(used, tr_.name);
    std::vector<uint8_t> host(alloc);
    CUDA_OR_DIE(cudaMemcpy(host.data(), base, alloc, cudaMemcpyDeviceToHost));
    const auto image = peer_image(size);
    for (auto &p : reads)
        ASSERT_EQ(0, memcmp(host.data() + kGap + p.local_off, image.data() + p.remote_off, p.length))
            << "READ of " << p.length << " bytes at +" << p.remote_off;
    EXPECT_EQ(host[kGap - 1], 0xee) << "no byte before our region";
    EXPECT_EQ(host[kGap + size + 4], 0xee) << "no byte between the pieces read";

    // WRITE fresh bytes from odd local offsets into odd places of region 1.
    for (uint64_t i = 0; i < alloc; ++i) host[i] = static_cast<uint8_t>(i * 31 + 7);
    CUDA_OR_DIE(cudaMemcpy(base, host.data(), alloc, cudaMemcpyHostToDevice));
    const std::vector<Piece> writes = {{7, 3, (4 << 20) + 9},
                                       {(4 << 20) + 100, size + 1, kSlice - 1},
                                       {size - 3, 77, 3},
                                       {(6 << 20) + 1, (6 << 20), (2 << 20) + 4095}};
    reqs.clear();
    auto expected = image;
    for (auto &p : writes) {
        reqs.push_back({Opcode::Write, dev + p.local_off, seg_, r1_ + p.remote_off, p.length, tr_.name});
        memcpy(expected.data() + size + p.remote_off, host.data() + kGap + p.local_off, p.length);
    }
    r = run(*engine_, reqs, &used);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(used, tr_.name);
    EXPECT_EQ(peer_->command("sum"), sum_line(expected)) << "the target's GPU memory holds exactly the bytes written";

    auto st = engine_->staging_stats();
    EXPECT_EQ(st.lent_bytes, 0u);
    EXPECT_GT(st.copies, 0u) << "the initiator staged its GPU memory";
    std::printf("%s: %zu READs and %zu WRITEs GPU->GPU byte-exact; initiator peak pinned %" PRIu64 " of %" PRIu64 "\n",
                tr_.name.c_str(), reads.size(), writes.size(), st.peak_lent_bytes, st.max_bytes);
    cudaFree(base);
}

TEST_P(GpuOverHostTransport, APeerKilledMidPipelineFailsEveryUnfinishedOpAndReturnsThePinnedMemory) {
    const uint64_t size = 64 << 20, op_len = (8 << 20) + 4097, ops = 32;
    ASSERT_TRUE(start_peer(size));
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), op_len * ops));
    ASSERT_TRUE(engine_->register_memory(dev, op_len * ops, {MemoryKind::Cuda, 0}));
    auto warm = run(*engine_, {{Opcode::Read, dev, seg_, r0_, 4096, tr_.name}});
    if (!warm && tr_.name == "efa" && warm.error().code == -EHOSTUNREACH)
        GTEST_SKIP() << "SKIPPED: the target did not register its GPU memory with efa: " << warm.error().message;
    ASSERT_TRUE(warm) << "connected before the kill: " << warm.error().message;

    std::vector<Request> reqs;  // 32 x 8 MiB, READs from region 0 and WRITEs into region 1
    for (uint64_t k = 0; k < ops; ++k) {
        uint64_t at = (k / 2 * op_len) % (size - op_len);
        reqs.push_back(
            {k % 2 ? Opcode::Write : Opcode::Read, dev + k * op_len, seg_, (k % 2 ? r1_ : r0_) + at, op_len, tr_.name});
    }
    // Once through whole, so every connection and lane is up and the kill meets moving bytes.
    auto whole = run(*engine_, reqs);
    ASSERT_TRUE(whole) << whole.error().message;
    auto b = engine_->submit(reqs);
    ASSERT_TRUE(b) << b.error().message;
    // Kill once the first op has completed: the rest are on the wire or in the pipeline then.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (engine_->status(*b, 0)->state == OpState::Pending && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
    peer_->kill_now();
    auto start = std::chrono::steady_clock::now();
    auto w = engine_->wait(*b, std::chrono::seconds(120));
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_FALSE(w) << "ops to a killed peer fail";
    EXPECT_NE(w.error().code, kWaitPending) << "every op ended: " << w.error().message;
    size_t failed = 0, done = 0;
    for (size_t i = 0; i < ops; ++i) {
        auto st = engine_->status(*b, i);
        ASSERT_TRUE(st);
        EXPECT_NE(st->state, OpState::Pending) << "op " << i;
        if (st->state == OpState::Failed) {
            ++failed;
            EXPECT_NE(st->code, 0) << "op " << i;
            EXPECT_FALSE(st->message.empty()) << "op " << i << " says why it failed";
        }
        done += st->state == OpState::Done;
    }
    EXPECT_GT(failed, 0u);
    EXPECT_EQ(engine_->staging_stats().lent_bytes, 0u) << "every pinned slice came back";
    std::printf("%s: target killed mid-pipeline: %zu of %" PRIu64
                " ops failed (%zu done before), wait ended in %.2f s,"
                " pinned lent %" PRIu64 " (peak %" PRIu64 "): %s\n",
                tr_.name.c_str(), failed, ops, done, s, engine_->staging_stats().lent_bytes,
                engine_->staging_stats().peak_lent_bytes, w.error().message.c_str());
    (void)engine_->free_batch(*b);

    // The engine goes on: a new target is served.
    ASSERT_TRUE(start_peer(1 << 20));
    auto again = run(*engine_, {{Opcode::Read, dev, seg_, r0_ + 5, 100000, tr_.name}});
    ASSERT_TRUE(again) << again.error().message;
    std::vector<uint8_t> host(100000);
    CUDA_OR_DIE(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < host.size(); ++i) ASSERT_EQ(host[i], test::peer_pattern(kGap + 5 + i)) << "byte " << i;
    cudaFree(dev);
}

INSTANTIATE_TEST_SUITE_P(HostTransports, GpuOverHostTransport, ::testing::Values("tcp", "shm", "efa"),
                         [](const auto &info) { return info.param; });
