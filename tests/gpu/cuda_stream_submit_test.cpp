// submit_on_stream on a real NVIDIA GPU: the caller's stream is held 300 ms by a host function of
// the test's own, then a GPU write of the source buffer (cudaMemsetAsync, a kernel) is queued,
// then the WRITE of that buffer ordered after it with submit_on_stream, then another memset of
// the source. The target must receive exactly the first memset's bytes, over staged tcp (a host
// target) and over cuda_ipc (a GPU target in another process), on a created stream and on the
// legacy default stream (torch's current stream unless a framework sets its own).
// Without a usable CUDA device every test here is skipped and says why.
#include <gtest/gtest.h>

#include <chrono>
#include <cinttypes>
#include <cstring>
#include <sstream>
#include <thread>

#include "cuda_util.hpp"
#include "ferry/engine.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

constexpr uint64_t kSize = 8 << 20;
constexpr uint8_t kWritten = 0x5a, kLater = 0xc3;

// Holds its stream 300 ms: what a long kernel ahead of the source's writer would do.
void hold_stream(void *) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

std::string sum_of(const std::vector<uint8_t> &v) {
    char line[64];
    snprintf(line, sizeof line, "SUM %" PRIx64, test::fnv1a(v.data(), v.size()));
    return line;
}

class CudaStreamSubmitTest : public test::CudaEngineTest {
protected:
    // Queues hold, memset(kWritten), the ordered WRITE and memset(kLater) on `stream`, then waits
    // for the batch (which must succeed) and the stream.
    static void ordered_write(Engine &e, uint8_t *dev, SegmentId seg, uint64_t remote, cudaStream_t stream) {
        CUDA_OR_DIE(cudaMemset(dev, 0x11, kSize));
        CUDA_OR_DIE(cudaLaunchHostFunc(stream, hold_stream, nullptr));
        CUDA_OR_DIE(cudaMemsetAsync(dev, kWritten, kSize, stream));
        auto t0 = std::chrono::steady_clock::now();
        std::vector<Request> w = {{Opcode::Write, dev, seg, remote, kSize, ""}};
        auto b = e.submit_on_stream(w, stream);
        double call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_TRUE(b) << b.error().message;
        CUDA_OR_DIE(cudaMemsetAsync(dev, kLater, kSize, stream));
        auto r = e.wait(*b, std::chrono::seconds(60));
        double done_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_TRUE(r) << r.error().message;
        auto st = e.status(*b, 0);
        ASSERT_TRUE(st);
        CUDA_OR_DIE(cudaStreamSynchronize(stream));
        uint8_t first = 0;
        CUDA_OR_DIE(cudaMemcpy(&first, dev, 1, cudaMemcpyDeviceToHost));
        EXPECT_EQ(first, kLater) << "the memset queued after the call ran";
        EXPECT_LT(call_s, 0.25) << "submit_on_stream waited for the stream";
        EXPECT_GE(done_s, 0.25) << "the batch ended before the work ahead of it on the stream";
        std::printf("%s on stream %p: call %.3f s, batch ended after %.3f s (stream held 0.3 s)\n",
                    st->transport.c_str(), static_cast<void *>(stream), call_s, done_s);
        EXPECT_TRUE(e.free_batch(*b));
    }
};

}  // namespace

TEST_F(CudaStreamSubmitTest, AWriteOverStagedTcpSendsWhatTheKernelBeforeItWrote) {
    PeerProcess peer({"--size", std::to_string(kSize)});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = Engine::create({{"plugins", "tcp"}, {"gpu_staging_slice_bytes", "1048576"}});
    ASSERT_TRUE(engine) << engine.error().message;
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), kSize));
    ASSERT_TRUE((*engine)->register_memory(dev, kSize, {MemoryKind::Cuda, 0}));
    auto seg = (*engine)->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    cudaStream_t created = nullptr;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    for (cudaStream_t stream : {created, cudaStream_t{nullptr}}) {
        ordered_write(**engine, dev, *seg, peer.base, stream);
        EXPECT_EQ(peer.command("sum"), sum_of(std::vector<uint8_t>(kSize, kWritten)))
            << "the host target holds what the memset before the call wrote";
    }
    CUDA_OR_DIE(cudaStreamDestroy(created));
    engine->reset();
    cudaFree(dev);
}

TEST_F(CudaStreamSubmitTest, AWriteOverCudaIpcSendsWhatTheKernelBeforeItWrote) {
    PeerProcess peer({std::to_string(kSize), "0"}, FERRY_GPU_TEST_PEER_BIN);
    std::istringstream ready(peer.ready_line);
    std::string word, segment, r0, r1;
    uint64_t size = 0;
    ready >> word >> segment >> r0 >> r1 >> size;
    ASSERT_EQ(word, "READY") << peer.ready_line;
    auto engine = Engine::create({{"plugins", "cuda_ipc"}});
    ASSERT_TRUE(engine) << engine.error().message;
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), kSize));
    ASSERT_TRUE((*engine)->register_memory(dev, kSize, {MemoryKind::Cuda, 0}));
    auto seg = (*engine)->open_segment(segment);
    ASSERT_TRUE(seg) << seg.error().message;
    // The peer's two regions: what it started with (its pattern over the whole allocation, with
    // a 4096-byte gap before each region), region 0 then overwritten by the WRITEs.
    constexpr uint64_t kGap = 4096;
    std::vector<uint8_t> want(2 * kSize);
    for (uint64_t i = 0; i < kSize; ++i) want[kSize + i] = test::peer_pattern(2 * kGap + kSize + i);
    std::fill(want.begin(), want.begin() + kSize, kWritten);
    cudaStream_t created = nullptr;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
    for (cudaStream_t stream : {created, cudaStream_t{nullptr}}) {
        ordered_write(**engine, dev, *seg, std::stoull(r0, nullptr, 16), stream);
        EXPECT_EQ(peer.command("sum"), sum_of(want)) << "the GPU target holds what the memset before the call wrote";
    }
    CUDA_OR_DIE(cudaStreamDestroy(created));
    engine->reset();
    cudaFree(dev);
}
