#include "cufile_api.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <fstream>

namespace ferry_gds {

namespace {

template <class F>
bool resolve(void *lib, F &fn, std::initializer_list<const char *> names, std::string &why) {
    for (const char *n : names)
        if (void *p = ::dlsym(lib, n)) {
            fn = reinterpret_cast<F>(p);
            return true;
        }
    why = std::string("libcufile has no ") + *names.begin() + " (a cuFile older than CUDA 11.4?)";
    return false;
}

}  // namespace

bool load_cufile(CuFile &api, std::string &why) {
    const char *env = std::getenv("FERRY_LIBCUFILE");
    const char *name = env && *env ? env : "libcufile.so.0";
    void *lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = ::dlerror();
        why = std::string("no ") + name + " (" + (e ? e : "not found") +
              "): install GPUDirect Storage's user space (the CUDA toolkit's libcufile) or set FERRY_LIBCUFILE";
        return false;
    }
    // Newer cufile.h maps cuFileDriverClose to cuFileDriverClose_v2; libcufile exports both.
    bool ok = resolve(lib, api.driver_open, {"cuFileDriverOpen"}, why) &&
              resolve(lib, api.driver_close, {"cuFileDriverClose_v2", "cuFileDriverClose"}, why) &&
              resolve(lib, api.handle_register, {"cuFileHandleRegister"}, why) &&
              resolve(lib, api.handle_deregister, {"cuFileHandleDeregister"}, why) &&
              resolve(lib, api.buf_register, {"cuFileBufRegister"}, why) &&
              resolve(lib, api.buf_deregister, {"cuFileBufDeregister"}, why) &&
              resolve(lib, api.read, {"cuFileRead"}, why) && resolve(lib, api.write, {"cuFileWrite"}, why);
    if (!ok) {
        ::dlclose(lib);
        return false;
    }
    api.library = lib;
    return true;
}

std::string cufile_error_text(int code) {
    // The first codes of CUfileOpError, as cufile.h numbers them; the rest by number.
    static const char *const kNames[] = {
        "CU_FILE_SUCCESS",
        "CU_FILE_DRIVER_NOT_INITIALIZED",
        "CU_FILE_DRIVER_INVALID_PROPS",
        "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        "CU_FILE_DRIVER_VERSION_MISMATCH",
        "CU_FILE_DRIVER_VERSION_READ_ERROR",
        "CU_FILE_DRIVER_CLOSING",
        "CU_FILE_PLATFORM_NOT_SUPPORTED",
        "CU_FILE_IO_NOT_SUPPORTED",
        "CU_FILE_DEVICE_NOT_SUPPORTED",
        "CU_FILE_NVFS_DRIVER_ERROR",
        "CU_FILE_CUDA_DRIVER_ERROR",
        "CU_FILE_CUDA_POINTER_INVALID",
        "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        "CU_FILE_CUDA_CONTEXT_MISMATCH",
        "CU_FILE_INVALID_MAPPING_SIZE",
        "CU_FILE_INVALID_MAPPING_RANGE",
        "CU_FILE_INVALID_FILE_TYPE",
        "CU_FILE_INVALID_FILE_OPEN_FLAG",
        "CU_FILE_DIO_NOT_SET",
    };
    static const char *const kMoreNames[] = {
        // 5022..5030
        "CU_FILE_INVALID_VALUE",
        "CU_FILE_MEMORY_ALREADY_REGISTERED",
        "CU_FILE_MEMORY_NOT_REGISTERED",
        "CU_FILE_PERMISSION_DENIED",
        "CU_FILE_DRIVER_ALREADY_OPEN",
        "CU_FILE_HANDLE_NOT_REGISTERED",
        "CU_FILE_HANDLE_ALREADY_REGISTERED",
        "CU_FILE_DEVICE_NOT_FOUND",
        "CU_FILE_INTERNAL_ERROR",
    };
    int index = code == 0 ? 0 : code - 5000;
    std::string name = index >= 0 && index < static_cast<int>(sizeof kNames / sizeof *kNames) ? kNames[index]
                       : index >= 22 && index <= 30                                           ? kMoreNames[index - 22]
                                                                                              : "cuFile error";
    std::string out = name + " (" + std::to_string(code) + ")";
    // What the lent H200's sandbox gave for every file: cuFile finds no udev data for the block
    // device (or none at all, tmpfs) and registers no file, even in compatibility mode.
    if (code == 5027)
        out +=
            ": cuFile could not register the file (its log, cufile.log, names why: e.g. no udev data for the "
            "block device in a container); file.so carries such files instead";
    return out;
}

std::string cufile_mode() {
    std::ifstream version("/proc/driver/nvidia-fs/version");
    std::string line;
    if (version && std::getline(version, line))
        return "GDS mode (nvidia-fs " + line + ": NVMe DMA straight to GPU memory)";
    return "compatibility mode (no nvidia-fs driver: cuFile moves data through host memory with POSIX I/O)";
}

}  // namespace ferry_gds
