// The bench's buffers: host memory, or GPU memory of one device (--use_vram), and the byte
// pattern --verify checks. The GPU runtime is found at run time (the CUDA driver's
// libcuda.so.1, or the HIP runtime of the ROCm variant the engine chose): nothing GPU-specific
// is compiled in, so one binary runs on hosts with and without a GPU.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ferry/engine.hpp"

namespace bench {

// Byte expected at `offset` of a buffer filled with `seed`: cheap, position-dependent, and
// different for every block so a misplaced block is caught.
inline uint8_t pattern(uint64_t offset, uint64_t seed) {
    uint64_t x = (offset >> 3) * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 29;
    return static_cast<uint8_t>(x >> (8 * (offset & 7)));
}

// p[i] = pattern(base + i, seed) for i < len, a word at a time where it can.
void fill_pattern(uint8_t *p, uint64_t len, uint64_t base, uint64_t seed);
// The first offset (base + i) whose byte is not pattern(base + i, seed), if any.
std::optional<uint64_t> find_mismatch(const uint8_t *p, uint64_t len, uint64_t base, uint64_t seed);

// A GPU runtime loaded at run time. Every call makes `device` current for itself only.
class GpuRuntime {
public:
    virtual ~GpuRuntime() = default;
    // CUDA ($FERRY_LIBCUDA, else libcuda.so.1), else HIP; nullptr with `why` naming what each
    // attempt found when neither has a usable device.
    static std::unique_ptr<GpuRuntime> open(std::string &why);

    virtual ferry::MemoryKind kind() const = 0;
    virtual int device_count() const = 0;
    virtual ferry::Result<void *> alloc(int device, uint64_t bytes) = 0;
    virtual void free(int device, void *ptr) = 0;
    virtual ferry::Result<void> to_device(int device, void *dst, const void *src, uint64_t bytes) = 0;
    virtual ferry::Result<void> to_host(int device, void *dst, const void *src, uint64_t bytes) = 0;
};

// "host", "cuda:0", "rocm:1": where a buffer or a remote region lives (Mooncake's location names
// with Ferry's memory kinds).
std::string location_name(ferry::MemoryKind kind, int device);

// One buffer the bench registers: page-aligned, pre-faulted host memory, or GPU memory.
class Buffer {
public:
    // huge: ask for transparent huge pages before the pages are faulted in (as Ferry's own
    // buffers do); the kernel may still give 4 KiB pages (huge_page_bytes() says).
    static ferry::Result<std::unique_ptr<Buffer>> host(uint64_t len, bool huge = true);
    // Bytes of the buffer that transparent huge pages back now (-1: unknown).
    int64_t huge_page_bytes() const;
    // Host memory from engine.alloc_shared (--shared_buffers): registered by the engine already,
    // freed with free_shared; shm.so maps it into peers.
    static ferry::Result<std::unique_ptr<Buffer>> shared(ferry::Engine &engine, uint64_t len);
    bool engine_registered() const { return engine_ != nullptr; }
    static ferry::Result<std::unique_ptr<Buffer>> device(GpuRuntime &gpu, int device, uint64_t len);
    ~Buffer();
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;

    uint8_t *data() const { return data_; }
    uint64_t size() const { return size_; }
    bool on_gpu() const { return gpu_ != nullptr; }
    ferry::MemoryOptions memory_options() const;
    std::string location() const;

    // The whole buffer set to the pattern of `seed` (through host memory for a GPU buffer).
    ferry::Result<void> fill(uint64_t seed);
    // [offset, offset + len) copied into host memory at `dst`.
    ferry::Result<void> read(uint64_t offset, uint8_t *dst, uint64_t len) const;

private:
    Buffer(uint8_t *data, uint64_t size, GpuRuntime *gpu, int device)
        : data_(data), size_(size), gpu_(gpu), device_(device) {}
    uint8_t *data_;
    uint64_t size_;
    GpuRuntime *gpu_;  // null: host memory
    int device_;
    ferry::Engine *engine_ = nullptr;  // shared(): the engine that allocated it
};

}  // namespace bench
