// GPU memory to and from files where gds.so is not loaded: file.so with the engine's pinned-slice
// staging, without a GPU, through the strict fake CUDA driver (fake_cuda.cpp: device addresses
// are PROT_NONE, so file.so or the core touching one directly crashes the test). Byte-exact
// against the file's own bytes (pread) and the fake device's (cuMemcpyDtoH), over several slices
// per op and at unaligned offsets.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "../file_test_util.hpp"
#include "ferry/engine.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

// The fake driver, loaded by path as the core loads it ($FERRY_LIBCUDA).
struct FakeCuda {
    FakeCuda() {
        setenv("FERRY_LIBCUDA", FERRY_FAKE_CUDA_LIB, 1);
        lib = dlopen(FERRY_FAKE_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
        if (!lib) return;
        auto sym = [&](auto &fn, const char *name) {
            fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, name));
        };
        int (*init)(unsigned);
        int (*retain)(void **, int);
        int (*push)(void *);
        sym(init, "cuInit");
        sym(retain, "cuDevicePrimaryCtxRetain");
        sym(push, "cuCtxPushCurrent_v2");
        sym(alloc_, "cuMemAlloc_v2");
        sym(htod_, "cuMemcpyHtoD_v2");
        sym(dtoh_, "cuMemcpyDtoH_v2");
        void *ctx = nullptr;
        ok = init(0) == 0 && retain(&ctx, 0) == 0 && push(ctx) == 0;
    }
    void *lib = nullptr;
    bool ok = false;
    int (*alloc_)(uintptr_t *, size_t) = nullptr;
    int (*htod_)(uintptr_t, const void *, size_t) = nullptr;
    int (*dtoh_)(void *, uintptr_t, size_t) = nullptr;
};

TEST(FileStaging, GpuMemoryMovesThroughPinnedSlicesToTheFileAndBack) {
    static FakeCuda cuda;
    ASSERT_TRUE(cuda.ok) << "the fake CUDA driver " << FERRY_FAKE_CUDA_LIB << " did not load: " << dlerror();
    ScratchDir dir(FERRY_TEST_DISK_DIR);
    std::string path = dir / "staged.bin";
    make_file(path, 0);
    // 64 KiB slices: a 1 MiB op takes 16, several in flight.
    auto e = Engine::create({{"plugins", "file"}, {"gpu_staging_slice_bytes", "65536"}});
    ASSERT_TRUE(e) << e.error().message;
    constexpr size_t kSize = 4 << 20;
    uintptr_t dev = 0;
    ASSERT_EQ(cuda.alloc_(&dev, kSize), 0);
    std::vector<char> src(kSize / 2);
    fill_pattern(src.data(), src.size(), 21);
    ASSERT_EQ(cuda.htod_(dev, src.data(), src.size()), 0);
    char *gpu = reinterpret_cast<char *>(dev);
    ASSERT_TRUE((*e)->register_memory(gpu, kSize, {MemoryKind::Cuda, 0}));
    auto seg = (*e)->open_segment("file:" + path);
    ASSERT_TRUE(seg) << seg.error().message;

    auto w = run_batch(
        **e, {op(Opcode::Write, gpu, *seg, 0, 1 << 20), op(Opcode::Write, gpu + 77, *seg, (1 << 20) + 5, 300001)});
    ASSERT_TRUE(w) << w.error().message;
    EXPECT_EQ(read_file(path, 0, 1 << 20), std::vector<char>(src.begin(), src.begin() + (1 << 20)));
    EXPECT_EQ(read_file(path, (1 << 20) + 5, 300001), std::vector<char>(src.begin() + 77, src.begin() + 77 + 300001));

    char *back = gpu + kSize / 2;
    auto r = run_batch(**e, {op(Opcode::Read, back, *seg, 0, 1 << 20),
                             op(Opcode::Read, back + (1 << 20) + 3, *seg, (1 << 20) + 5, 300001)});
    ASSERT_TRUE(r) << r.error().message;
    std::vector<char> got(kSize / 2);
    ASSERT_EQ(cuda.dtoh_(got.data(), reinterpret_cast<uintptr_t>(back), got.size()), 0);
    EXPECT_EQ(std::memcmp(got.data(), src.data(), 1 << 20), 0);
    EXPECT_EQ(std::memcmp(got.data() + (1 << 20) + 3, src.data() + 77, 300001), 0);
    EXPECT_GE((*e)->staging_stats().copies, 2u * (16 + 5)) << "the ops did not go through the staging slices";

    // A READ past the end fails through the staged path too, naming the file.
    auto past = run_batch(**e, {op(Opcode::Read, back, *seg, 8 << 20, 65536)});
    ASSERT_FALSE(past);
    EXPECT_EQ(past.error().code, -ENODATA) << past.error().message;
    EXPECT_NE(past.error().message.find(path), std::string::npos) << past.error().message;
}

}  // namespace
