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
