// gds.so's ceiling: a raw cuFile loop, the same calls gds.so makes without the engine around
// them. THREADS threads each cuFileRead (or cuFileWrite) BLOCK-byte blocks of one registered
// cudaMalloc buffer, walking their share of the file in turn, for SECONDS; prints GB/s and the
// cuFile mode (GDS or compatibility). Compare with
//   transfer_engine_bench --protocol=gds --segment_id=file:FILE --use_vram --block_size=BLOCK
// (docs/STORAGE.md; tests/gpu/device_check.sh gds runs both and file.so's staged path).
//
//   cufile_raw_bench FILE [read|write] [BLOCK] [THREADS] [SECONDS] [FILE_BYTES]
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cufile_api.hpp"

using namespace ferry_gds;

namespace {

[[noreturn]] void die(const std::string &what) {
    std::fprintf(stderr, "cufile_raw_bench: %s\n", what.c_str());
    std::exit(1);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 2) die("usage: cufile_raw_bench FILE [read|write] [BLOCK] [THREADS] [SECONDS] [FILE_BYTES]");
    std::string path = argv[1];
    bool write = argc > 2 && std::string(argv[2]) == "write";
    uint64_t block = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1 << 20;
    unsigned threads = argc > 4 ? static_cast<unsigned>(std::atoi(argv[4])) : 4;
    double seconds = argc > 5 ? std::atof(argv[5]) : 5;
    uint64_t file_bytes = argc > 6 ? std::strtoull(argv[6], nullptr, 10) : 1ull << 30;
    if (!block || !threads || file_bytes < block * threads) die("FILE_BYTES must hold THREADS blocks");

    CuFile api{};
    std::string why;
    if (!load_cufile(api, why)) die(why);
    if (CUfileError e = api.driver_open(); e.err) die("cuFileDriverOpen: " + cufile_error_text(e.err));
    int fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CREAT, 0600);
    if (fd < 0) fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);  // compat mode takes buffered files
    if (fd < 0) die("open " + path);
    CUfileDescr d{};
    d.type = kCuFileHandleTypeOpaqueFd;
    d.handle.fd = fd;
    CUfileHandle fh = nullptr;
    if (CUfileError e = api.handle_register(&fh, &d); e.err) die("cuFileHandleRegister: " + cufile_error_text(e.err));
    char *gpu = nullptr;
    if (cudaMalloc(reinterpret_cast<void **>(&gpu), block * threads) != cudaSuccess) die("cudaMalloc");
    cudaMemset(gpu, 0x5a, block * threads);
    bool registered = api.buf_register(gpu, block * threads, 0).err == 0;

    std::atomic<uint64_t> bytes{0};
    std::atomic<bool> failed{false};
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    uint64_t share = file_bytes / threads / block * block;
    std::vector<std::thread> pool;
    auto start = std::chrono::steady_clock::now();
    for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            cudaSetDevice(0);
            uint64_t off = 0;
            while (std::chrono::steady_clock::now() < end && !failed) {
                off_t file_off = static_cast<off_t>(t * share + off);
                off_t buf_off = registered ? static_cast<off_t>(t * block) : 0;
                void *base = registered ? gpu : gpu + t * block;
                ssize_t n = write ? api.write(fh, base, block, file_off, buf_off)
                                  : api.read(fh, base, block, file_off, buf_off);
                if (n != static_cast<ssize_t>(block)) {
                    std::fprintf(stderr, "cufile_raw_bench: %s at %lld returned %zd\n",
                                 write ? "cuFileWrite" : "cuFileRead", static_cast<long long>(file_off), n);
                    failed = true;
                }
                bytes += block;
                off = (off + block) % share;
            }
        });
    for (auto &t : pool) t.join();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("raw cuFile %s: %.2f GB/s (%llu-byte blocks, %u threads, %.1f s, buffer %s; %s)\n",
                write ? "write" : "read", bytes / secs / 1e9, static_cast<unsigned long long>(block), threads, secs,
                registered ? "registered" : "not registered", cufile_mode().c_str());
    if (registered) api.buf_deregister(gpu);
    api.handle_deregister(fh);
    ::close(fd);
    cudaFree(gpu);
    api.driver_close();
    return failed ? 1 : 0;
}
