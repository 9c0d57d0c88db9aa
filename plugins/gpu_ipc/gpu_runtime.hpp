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
};

// Defined by the backend the plugin is built with.
std::unique_ptr<Runtime> make_runtime();

}  // namespace ferry_gpu
