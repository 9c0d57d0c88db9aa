// The few GPU runtime calls GPU IPC needs, behind one interface with two backends: CUDA
// (cuda/cuda_runtime.cpp, cudart linked statically so only the driver is needed at run time)
// and HIP (hip/hip_runtime.cpp, libamdhip64 opened at run time). Everything else in gpu_ipc/ is
// shared.
//
// Every call returns 0 or a negative errno-style code and fills `error` with the runtime's own
// name and text for the failure, e.g. "cudaIpcOpenMemHandle: invalid device context (201)".
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ferry_gpu {

inline constexpr size_t kIpcHandleBytes = 64;  // cudaIpcMemHandle_t and hipIpcMemHandle_t

struct IpcHandle {
    uint8_t bytes[kIpcHandleBytes];
};

using Stream = void *;
using Event = void *;

// The batch copy kernel (copy_kernel.cu): one launch copies a whole table of ops, each op cut
// into chunks of 2^kCopyChunkShift bytes that the launch's thread blocks take in turn. The table
// lives in device memory; the transport fills it in pinned host memory and copies it over on the
// launch's stream. Its layout is the kernel's `CopyOp`.
struct CopyTableEntry {
    uint64_t src, dst, bytes;
    uint64_t first_chunk;  // the op's first chunk in the launch: entries are sorted by it
};
static_assert(sizeof(CopyTableEntry) == 32);
inline constexpr uint32_t kCopyChunkShift = 16;      // 64 KiB chunks
inline constexpr uint32_t kCopyKernelThreads = 512;  // threads per block
inline constexpr const char *kCopyKernelName = "ferry_copy_table";

// The same kernel with its table in the launch's parameters (copy_kernel.cu's InlineTable<N>):
// no table copy ahead of it on the stream. Entries are narrower (an op of up to 4 GiB, up to
// 2^32 chunks a launch), and one kernel per table size in kInlineTableSizes, the smallest that
// holds a launch's entries going.
struct InlineCopyOp {
    uint64_t src, dst;
    uint32_t bytes, first_chunk;
};
static_assert(sizeof(InlineCopyOp) == 24);
inline constexpr uint32_t kInlineTableSizes[] = {64, 256, 1024};
inline constexpr uint32_t kInlineTableOps = 1024;  // the largest of them

// Chunks of 2^kCopyChunkShift bytes an op of `bytes` is cut into.
inline constexpr uint64_t copy_chunks(uint64_t bytes) {
    return (bytes + (uint64_t{1} << kCopyChunkShift) - 1) >> kCopyChunkShift;
}

// One launch's parameter as the kernel takes it (InlineTable<N> for the smallest N of
// kInlineTableSizes that holds n entries: the driver reads that prefix of it), built in place
// so the launch passes it as it is.
struct InlineLaunch {
    uint32_t n = 0, chunks = 0;
    InlineCopyOp ops[kInlineTableOps];
    void add(uint64_t src, uint64_t dst, uint64_t bytes) {  // n < kInlineTableOps, bytes < 4 GiB
        ops[n++] = {src, dst, static_cast<uint32_t>(bytes), chunks};
        chunks += static_cast<uint32_t>(copy_chunks(bytes));
    }
};
static_assert(offsetof(InlineLaunch, ops) == 8, "copy_kernel.cu's InlineTable<N>: n, chunks, then the entries");

class Runtime {
public:
    virtual ~Runtime() = default;

    virtual const char *name() const = 0;      // "CUDA" or "HIP"
    virtual uint32_t memory_kind() const = 0;  // FERRY_MEM_CUDA or FERRY_MEM_ROCM

    // Usable here? available=false with a plain reason when the driver or device is missing.
    virtual void probe(bool &available, std::string &reason) = 0;

    virtual int device_count(int &count, std::string &error) = 0;
    virtual int current_device(int &device, std::string &error) = 0;
    virtual int set_device(int device, std::string &error) = 0;

    // Device of a pointer, and whether it is device memory at all.
    virtual int pointer_device(const void *ptr, int &device, bool &is_device, std::string &error) = 0;
    // Start and size of the allocation holding ptr (IPC handles cover whole allocations).
    virtual int allocation_range(const void *ptr, uintptr_t &base, size_t &size, std::string &error) = 0;

    virtual int ipc_export(void *base, IpcHandle &handle, std::string &error) = 0;
    // Opens on the current device, with peer access enabled lazily.
    virtual int ipc_open(const IpcHandle &handle, void *&mapped, std::string &error) = 0;
    virtual int ipc_close(void *mapped, std::string &error) = 0;

    // Peer access from `device` to `peer`: 0 when enabled or already enabled (the sticky
    // "already enabled" error is cleared), -ENOTSUP when the pair cannot.
    virtual int enable_peer_access(int device, int peer, std::string &error) = 0;

    virtual int stream_create(Stream &stream, std::string &error) = 0;
    virtual void stream_destroy(Stream stream) = 0;
    virtual int event_create(Event &event, std::string &error) = 0;
    virtual void event_destroy(Event event) = 0;
    virtual int event_record(Event event, Stream stream, std::string &error) = 0;
    // 1: done, 0: not yet, < 0: the work before the event failed.
    virtual int event_query(Event event, std::string &error) = 0;
    // Blocks until the event completes; 0 or the failure.
    virtual int event_wait(Event event, std::string &error) = 0;
    // Device-to-device (or any UVA) copy on a stream.
    virtual int copy_async(void *dst, const void *src, size_t bytes, Stream stream, std::string &error) = 0;
    // Blocks until everything queued on the stream ended; 0 or the failure. For the rare path
    // where copies are queued but no event could be recorded behind them.
    virtual int stream_wait(Stream stream, std::string &error) = 0;

    // The runtime's batched copy (CUDA 12.8+ cuMemcpyBatchAsync, HIP's hipMemcpyBatchAsync),
    // looked up in the driver at run time: false where it has none. Its copies run in stream
    // order as a whole, in any order among themselves.
    virtual bool has_copy_batch() { return false; }
    // n copies on one stream in one call. On failure nothing is known about which copies were
    // queued (the caller copies them one by one instead: the same bytes to the same places).
    virtual int copy_batch(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t n, Stream stream,
                           std::string &error) {
        (void)dsts, (void)srcs, (void)sizes, (void)n, (void)stream;
        error = "no batched copy in this runtime";
        return -ENOSYS;
    }

    // The copy kernel on `device`: compiled for the GPU there on first use (CUDA: embedded PTX
    // JIT-compiled by the driver; HIP: hipRTC for the device's architecture) and kept. Fails
    // with the reason when it cannot be had; the transport then copies op by op.
    virtual int copy_kernel_load(int device, std::string &error) {
        (void)device;
        error = "this runtime has no copy kernel";
        return -ENOSYS;
    }
    // A table of `bytes` in pinned host memory and in memory of the current device.
    virtual int table_alloc(size_t bytes, void *&host, void *&device_table, std::string &error) {
        (void)bytes, (void)host, (void)device_table;
        error = "this runtime has no copy kernel";
        return -ENOSYS;
    }
    virtual void table_free(void *host, void *device_table) { (void)host, (void)device_table; }
    // Queues the kernel on `stream` of the current device (`device`, loaded before): `n` entries
    // of `table` (device memory), `chunks` chunks in all, on `blocks` thread blocks.
    virtual int copy_kernel_launch(int device, const void *table, uint32_t n, uint64_t chunks, uint32_t blocks,
                                   Stream stream, std::string &error) {
        (void)device, (void)table, (void)n, (void)chunks, (void)blocks, (void)stream;
        error = "this runtime has no copy kernel";
        return -ENOSYS;
    }
    // Whether `device` (its copy kernel loaded) also runs the kernel that takes its table in the
    // launch's parameters; where not, `why` says why (once asked, the answer is kept).
    virtual bool copy_kernel_inline(int device, std::string &why) {
        (void)device;
        why = "this runtime passes the copy kernel's table in device memory only";
        return false;
    }
    // Queues that kernel on `stream` of the current device: `launch` (1 to kInlineTableOps
    // entries) on `blocks` thread blocks. The launch takes its own copy of it: the caller's
    // buffer is free once this returned.
    virtual int copy_kernel_launch_inline(int device, const InlineLaunch &launch, uint32_t blocks, Stream stream,
                                          std::string &error) {
        (void)device, (void)launch, (void)blocks, (void)stream;
        error = "this runtime passes the copy kernel's table in device memory only";
        return -ENOSYS;
    }
};

// Defined by the backend the plugin is built with.
std::unique_ptr<Runtime> make_runtime();

}  // namespace ferry_gpu
