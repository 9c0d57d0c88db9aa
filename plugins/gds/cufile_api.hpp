// The part of NVIDIA's cuFile API (GPUDirect Storage, libcufile.so.0) gds.so calls, declared
// from its public documentation and looked up at run time: hosts without libcufile still load
// the core, and ferry-info says what is missing.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>

namespace ferry_gds {

// CUfileError_t: cuFile's own code (CU_FILE_SUCCESS = 0, the others from 5000) and, for
// CU_FILE_CUDA_DRIVER_ERROR, the CUDA driver's.
struct CUfileError {
    int err;
    int cu_err;
};
constexpr int kCuFileSuccess = 0;
constexpr int kCuFileHandleTypeOpaqueFd = 1;

// CUfileDescr_t for an opaque (POSIX) descriptor.
struct CUfileDescr {
    int type;
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;  // NULL for OPAQUE_FD
};
using CUfileHandle = void *;

struct CuFile {
    CUfileError (*driver_open)();
    CUfileError (*driver_close)();
    CUfileError (*handle_register)(CUfileHandle *fh, CUfileDescr *descr);
    void (*handle_deregister)(CUfileHandle fh);
    CUfileError (*buf_register)(const void *base, size_t length, int flags);
    CUfileError (*buf_deregister)(const void *base);
    ssize_t (*read)(CUfileHandle fh, void *base, size_t size, off_t file_offset, off_t base_offset);
    ssize_t (*write)(CUfileHandle fh, const void *base, size_t size, off_t file_offset, off_t base_offset);
    void *library = nullptr;
};

// dlopen()s libcufile.so.0 ($FERRY_LIBCUFILE when set) and resolves every call; on failure
// returns false and says why (the library or the symbol missing).
bool load_cufile(CuFile &api, std::string &why);

// cuFile's code as text, e.g. "CU_FILE_DRIVER_NOT_INITIALIZED (5001)".
std::string cufile_error_text(int code);

// Which path cuFile takes here: "GDS mode (nvidia-fs <version>: ...)" where the nvidia-fs kernel driver is
// loaded, else "compatibility mode (no nvidia-fs driver: cuFile moves data through host memory
// with POSIX I/O)".
std::string cufile_mode();

}  // namespace ferry_gds
