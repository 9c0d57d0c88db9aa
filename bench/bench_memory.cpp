#include "bench_memory.hpp"

#include <sys/mman.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <vector>

#include "huge_pages.hpp"

namespace bench {

namespace {
inline uint64_t pattern_word(uint64_t offset, uint64_t seed) {  // offset % 8 == 0
    uint64_t x = (offset >> 3) * 0x9E3779B97F4A7C15ull + seed;
    return x ^ (x >> 29);
}
constexpr bool kLittle = std::endian::native == std::endian::little;
}  // namespace

// 1 GiB per side took seconds byte by byte, which every bench run paid before measuring.
void fill_pattern(uint8_t *p, uint64_t len, uint64_t base, uint64_t seed) {
    uint64_t i = 0;
    for (; i < len && ((base + i) & 7); ++i) p[i] = pattern(base + i, seed);
    if constexpr (kLittle)
        for (; i + 8 <= len; i += 8) {
            uint64_t x = pattern_word(base + i, seed);
            std::memcpy(p + i, &x, 8);
        }
    for (; i < len; ++i) p[i] = pattern(base + i, seed);
}

std::optional<uint64_t> find_mismatch(const uint8_t *p, uint64_t len, uint64_t base, uint64_t seed) {
    uint64_t i = 0;
    for (; i < len && ((base + i) & 7); ++i)
        if (p[i] != pattern(base + i, seed)) return base + i;
    if constexpr (kLittle)
        for (; i + 8 <= len; i += 8) {
            uint64_t x = pattern_word(base + i, seed);
            if (std::memcmp(p + i, &x, 8) != 0) break;  // the byte loop below names the offset
        }
    for (; i < len; ++i)
        if (p[i] != pattern(base + i, seed)) return base + i;
    return std::nullopt;
}

std::string location_name(ferry::MemoryKind kind, int device) {
    if (kind == ferry::MemoryKind::Host) return "host";
    if (kind == ferry::MemoryKind::Cuda) return "cuda:" + std::to_string(device);
    if (kind == ferry::MemoryKind::Rocm) return "rocm:" + std::to_string(device);
    return "memory kind " + std::to_string(static_cast<unsigned>(kind));  // a kind newer than this bench
}

ferry::Result<std::unique_ptr<Buffer>> Buffer::host(uint64_t len, bool huge) {
    std::string error;
    void *p = ferry::map_prefaulted(len, huge, error);
    if (!p) return ferry::fail(-ENOMEM, "cannot allocate host memory: " + error + "; lower --buffer_size");
    return std::unique_ptr<Buffer>(new Buffer(static_cast<uint8_t *>(p), len, nullptr, -1));
}

int64_t Buffer::huge_page_bytes() const { return gpu_ ? 0 : ferry::huge_page_bytes(data_, size_); }

ferry::Result<std::unique_ptr<Buffer>> Buffer::shared(ferry::Engine &engine, uint64_t len) {
    auto p = engine.alloc_shared(len);
    if (!p) return std::unexpected(p.error());
    auto b = std::unique_ptr<Buffer>(new Buffer(static_cast<uint8_t *>(*p), len, nullptr, -1));
    b->engine_ = &engine;
    return b;
}

ferry::Result<std::unique_ptr<Buffer>> Buffer::device(GpuRuntime &gpu, int device, uint64_t len) {
    auto p = gpu.alloc(device, len);
    if (!p) return std::unexpected(p.error());
    return std::unique_ptr<Buffer>(new Buffer(static_cast<uint8_t *>(*p), len, &gpu, device));
}

Buffer::~Buffer() {
    if (gpu_) gpu_->free(device_, data_);
    else if (engine_) (void)engine_->free_shared(data_);
    else munmap(data_, size_);
}

ferry::MemoryOptions Buffer::memory_options() const {
    ferry::MemoryOptions m;
    if (gpu_) {
        m.kind = gpu_->kind();
        m.device = device_;
    }
    return m;
}

std::string Buffer::location() const {
    return gpu_ ? location_name(gpu_->kind(), device_) : location_name(ferry::MemoryKind::Host, -1);
}

ferry::Result<void> Buffer::fill(uint64_t seed) {
    if (!gpu_) {
        fill_pattern(data_, size_, 0, seed);
        return {};
    }
    constexpr uint64_t kChunk = 64ull << 20;  // a multiple of 8: every chunk takes the word path
    std::vector<uint8_t> host(std::min(kChunk, size_));
    for (uint64_t off = 0; off < size_; off += kChunk) {
        uint64_t n = std::min(kChunk, size_ - off);
        fill_pattern(host.data(), n, off, seed);
        if (auto r = gpu_->to_device(device_, data_ + off, host.data(), n); !r) return r;
    }
    return {};
}

ferry::Result<void> Buffer::read(uint64_t offset, uint8_t *dst, uint64_t len) const {
    if (!gpu_) {
        std::memcpy(dst, data_ + offset, len);
        return {};
    }
    return gpu_->to_host(device_, dst, data_ + offset, len);
}

}  // namespace bench
