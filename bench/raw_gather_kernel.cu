// gpu_ipc_bench's ceiling: the plainest gather kernel, in one process, for the same blocks
// cuda_ipc.so copies. Thread block b copies blocks b, b + G, ... of the table with 16-byte
// words, 512 threads each; every address and length is a multiple of 16 (the bench's blocks
// are). nvcc makes PTX of it at build time; the bench loads it with the driver API.
struct RawOp {
    unsigned long long src, dst, bytes;
};
struct alignas(16) Word16 {
    unsigned long long lo, hi;
};

extern "C" __global__ void raw_gather(const RawOp *ops, unsigned n) {
    for (unsigned i = blockIdx.x; i < n; i += gridDim.x) {
        const Word16 *s = reinterpret_cast<const Word16 *>(ops[i].src);
        Word16 *d = reinterpret_cast<Word16 *>(ops[i].dst);
        const unsigned long long words = ops[i].bytes / 16;
        for (unsigned long long w = threadIdx.x; w < words; w += blockDim.x) d[w] = s[w];
    }
}

// The same kernel with its table in the launch's parameters (up to 256 ops, 6 KiB), as
// cuda_ipc.so passes it: the ceiling of that launch form, to tell a launch's cost from the
// engine's. Parameters over 4 KiB need compute_70 and a CUDA 12.1 driver.
struct RawTable256 {
    RawOp ops[256];
    unsigned n;
};

extern "C" __global__ void raw_gather_in_launch(const __grid_constant__ RawTable256 t) {
    for (unsigned i = blockIdx.x; i < t.n; i += gridDim.x) {
        const Word16 *s = reinterpret_cast<const Word16 *>(t.ops[i].src);
        Word16 *d = reinterpret_cast<Word16 *>(t.ops[i].dst);
        const unsigned long long words = t.ops[i].bytes / 16;
        for (unsigned long long w = threadIdx.x; w < words; w += blockDim.x) d[w] = s[w];
    }
}
