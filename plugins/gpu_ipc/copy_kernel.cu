// The GPU IPC transport's batch copy kernel: one launch copies a table of ops (KV-sized blocks)
// that would otherwise cost one copy-engine launch each. The same text is the CUDA kernel
// (nvcc turns it into PTX at build time; the driver JIT-compiles that for whatever GPU runs it)
// and the HIP kernel (hipRTC compiles it at run time for the device's architecture), so it uses
// nothing but the language: no headers, no intrinsics.
//
// Work is cut into chunks of 2^kChunkShift bytes of every op, numbered across the table; block b
// of G copies chunks b, b + G, b + 2G, ..., so a launch capped at a few blocks (to leave the
// model's kernels their SMs) still copies everything, and an uncapped one spreads over the GPU.
// A chunk is copied with the widest word both its addresses allow (16 bytes for KV blocks), with
// eight loads in flight per thread before their stores; odd heads and tails go byte by byte.
// Ops of one table never overlap (the transport's contract), so nothing orders their stores.

#define FERRY_COPY_CHUNK_SHIFT 16  // gpu_runtime.hpp's kCopyChunkShift
#define FERRY_COPY_UNROLL 8
#ifdef FERRY_COPY_KERNEL_ON_HOST  // the CPU run of the transport's tests (copy_kernel_host.hpp)
#define FERRY_PRAGMA_UNROLL
#else
#define FERRY_PRAGMA_UNROLL _Pragma("unroll")
#endif

struct CopyOp {  // gpu_runtime.hpp's CopyTableEntry
    unsigned long long src, dst, bytes, first_chunk;
};

struct alignas(16) Word16 {
    unsigned long long lo, hi;
};

template <typename Word>
__device__ void copy_words(const unsigned char *src, unsigned char *dst, unsigned long long len) {
    const unsigned long long width = sizeof(Word);
    unsigned long long head = (width - (reinterpret_cast<unsigned long long>(src) & (width - 1))) & (width - 1);
    if (head > len) head = len;
    for (unsigned long long i = threadIdx.x; i < head; i += blockDim.x) dst[i] = src[i];
    const Word *ws = reinterpret_cast<const Word *>(src + head);
    Word *wd = reinterpret_cast<Word *>(dst + head);
    const unsigned long long words = (len - head) / width;
    const unsigned long long step = blockDim.x;
    unsigned long long i = threadIdx.x;
    for (; i + (FERRY_COPY_UNROLL - 1) * step < words; i += FERRY_COPY_UNROLL * step) {
        Word w[FERRY_COPY_UNROLL];
        FERRY_PRAGMA_UNROLL
        for (int k = 0; k < FERRY_COPY_UNROLL; ++k) w[k] = ws[i + k * step];
        FERRY_PRAGMA_UNROLL
        for (int k = 0; k < FERRY_COPY_UNROLL; ++k) wd[i + k * step] = w[k];
    }
    for (; i < words; i += step) wd[i] = ws[i];
    for (unsigned long long j = head + words * width + threadIdx.x; j < len; j += step) dst[j] = src[j];
}

// Copies the chunks of `ops` (`n` entries, `chunks` chunks in all) that fall to this block.
// `Op` is CopyOp or InlineCopyOp: the same fields, narrower in the launch-parameter table.
template <typename Op>
__device__ void copy_table(const Op *ops, unsigned n, unsigned long long chunks) {
    for (unsigned long long c = blockIdx.x; c < chunks; c += gridDim.x) {
        // The op holding chunk c: the last entry whose first chunk is <= c (the same answer in
        // every thread, from the same cached lines). Where every op is one chunk (KV blocks of up
        // to 64 KiB) that is entry c itself: no search, whose dependent loads would cost more
        // than copying such a block.
        unsigned lo = chunks == n ? static_cast<unsigned>(c) : 0, hi = chunks == n ? lo : n - 1;
        while (lo < hi) {
            unsigned mid = (lo + hi + 1) / 2;
            if (ops[mid].first_chunk <= c) lo = mid;
            else hi = mid - 1;
        }
        const unsigned long long op_src = ops[lo].src, op_dst = ops[lo].dst;
        const unsigned long long offset = (c - ops[lo].first_chunk) << FERRY_COPY_CHUNK_SHIFT;
        unsigned long long len = ops[lo].bytes - offset;
        if (len > (1ull << FERRY_COPY_CHUNK_SHIFT)) len = 1ull << FERRY_COPY_CHUNK_SHIFT;
        const unsigned char *src = reinterpret_cast<const unsigned char *>(op_src) + offset;
        unsigned char *dst = reinterpret_cast<unsigned char *>(op_dst) + offset;
        const unsigned long long apart = op_src ^ op_dst;
        if ((apart & 15) == 0) copy_words<Word16>(src, dst, len);
        else if ((apart & 7) == 0) copy_words<unsigned long long>(src, dst, len);
        else if ((apart & 3) == 0) copy_words<unsigned int>(src, dst, len);
        else copy_words<unsigned char>(src, dst, len);
    }
}

// 512 threads a block (gpu_runtime.hpp's kCopyKernelThreads): the compilers may plan registers
// for that instead of 1024.
extern "C" __global__ void __launch_bounds__(512)
    ferry_copy_table(const CopyOp *ops, unsigned n, unsigned long long chunks) {
    copy_table(ops, n, chunks);
}

#ifdef FERRY_COPY_KERNEL_INLINE
// The table carried in the launch's own parameters (CUDA 12.1 drivers take up to 32,764 bytes
// of them on Volta and newer): the launch brings it to the GPU, so no copy of a table precedes
// the kernel on its stream, and the host's buffer is free again once the launch returned.
// __grid_constant__ lets the kernel read it where the launch put it (the constant bank) instead
// of a private copy per thread. One kernel per table size, so a small batch sends little.
struct InlineCopyOp {  // gpu_runtime.hpp's InlineCopyOp
    unsigned long long src, dst;
    unsigned bytes, first_chunk;
};

template <unsigned N>
struct InlineTable {  // gpu_runtime.hpp's InlineLaunch, its first N entries
    unsigned n, chunks;
    InlineCopyOp ops[N];
};

#define FERRY_COPY_INLINE_KERNEL(N)                                                                  \
    extern "C" __global__ void __launch_bounds__(512)                                              \
        ferry_copy_inline_##N(const __grid_constant__ InlineTable<N> table) {                      \
        copy_table(table.ops, table.n, table.chunks);                                              \
    }
FERRY_COPY_INLINE_KERNEL(64)
FERRY_COPY_INLINE_KERNEL(256)
FERRY_COPY_INLINE_KERNEL(1024)
#undef FERRY_COPY_INLINE_KERNEL
#endif
