// A shared object loaded from a descriptor the caller opened and checked (file_trust.hpp), so
// the library mapped is the file checked: dlopen("/proc/self/fd/N").
#pragma once

#include <string>
#include <utility>

#include "ferry/result.hpp"

namespace ferry {

// An open dlopen handle, closed (dlclose) with the last owner: move-only.
class SharedLibrary {
public:
    SharedLibrary() = default;
    SharedLibrary(SharedLibrary &&o) noexcept : handle_(std::exchange(o.handle_, nullptr)) {}
    SharedLibrary &operator=(SharedLibrary &&o) noexcept {
        if (this != &o) {
            reset();
            handle_ = std::exchange(o.handle_, nullptr);
        }
        return *this;
    }
    SharedLibrary(const SharedLibrary &) = delete;
    SharedLibrary &operator=(const SharedLibrary &) = delete;
    ~SharedLibrary() { reset(); }

    // dlopen(RTLD_NOW | RTLD_LOCAL) of the file open on `fd`, checked afterwards to be that file
    // (the dynamic loader knows libraries by name, and "/proc/self/fd/N" names whatever N was
    // when it first loaded). Errors carry the dynamic loader's own text, with `path` (the file's
    // name for messages) for the descriptor's.
    static Result<SharedLibrary> load_fd(int fd, const std::string &path);

    explicit operator bool() const { return handle_ != nullptr; }
    void *symbol(const char *name) const;  // nullptr when absent
    void reset();

private:
    explicit SharedLibrary(void *handle) : handle_(handle) {}
    void *handle_ = nullptr;
};

}  // namespace ferry
