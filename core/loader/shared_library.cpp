#include "loader/shared_library.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "util/fd.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

// Names tried before giving up; each is a new descriptor number, and only a library the
// dynamic loader still holds under a name can take one, so a few always suffice.
constexpr int kNamesToTry = 16;

bool read_exact(int fd, void *buf, size_t n, off_t at) {
    auto *p = static_cast<char *>(buf);
    while (n > 0) {
        ssize_t got = ::pread(fd, p, n, at);
        if (got <= 0) return false;
        p += got;
        n -= static_cast<size_t>(got);
        at += got;
    }
    return true;
}

bool has_text_relocations(const ElfW(Dyn) * d) {
    for (; d && d->d_tag != DT_NULL; ++d)
        if (d->d_tag == DT_TEXTREL || (d->d_tag == DT_FLAGS && (d->d_un.d_val & DF_TEXTREL))) return true;
    return false;
}

// The program headers the dynamic loader keeps for the object loaded at `map`.
struct LoadedHeaders {
    const struct link_map *map;
    const ElfW(Phdr) *phdr = nullptr;
    size_t phnum = 0;
};
int find_headers(struct dl_phdr_info *info, size_t, void *data) {
    auto *found = static_cast<LoadedHeaders *>(data);
    if (info->dlpi_addr != found->map->l_addr || info->dlpi_name != found->map->l_name) return 0;
    found->phdr = info->dlpi_phdr;
    found->phnum = info->dlpi_phnum;
    return 1;
}

// Byte comparison of a loaded object's mapped segments with the file, not instrumented: in a
// sanitizer build the object's read-only data holds the sanitizer's poisoned redzones around
// its globals, which ASan's memcmp would report though nothing reads past anything here.
__attribute__((no_sanitize("address", "undefined"))) bool same_bytes(const char *mapped, const char *file, size_t n) {
    unsigned char diff = 0;
    for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(mapped[i] ^ file[i]);
    return diff == 0;
}

// Is the library behind `handle` the file open on `fd`? glibc finds an already loaded library by
// the name it was opened as (and every name it was opened as since) before it opens anything:
// once "/proc/self/fd/7" named one plugin that stays loaded (efa.so is NODELETE), a later
// dlopen("/proc/self/fd/7") of another file returns the first. The mapped read-only segments
// (headers, code, constants: the loader never writes them) must hold the file's bytes.
bool is_file(void *handle, int fd) {
    struct link_map *map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) return false;
    ElfW(Ehdr) eh;
    if (!read_exact(fd, &eh, sizeof eh, 0) || eh.e_phentsize != sizeof(ElfW(Phdr))) return false;
    std::vector<ElfW(Phdr)> phdrs(eh.e_phnum);
    if (!read_exact(fd, phdrs.data(), phdrs.size() * sizeof(ElfW(Phdr)), static_cast<off_t>(eh.e_phoff))) return false;
    // The same segments first: only then is every address compared below mapped.
    LoadedHeaders loaded{map};
    dl_iterate_phdr(find_headers, &loaded);
    if (loaded.phnum != phdrs.size() ||
        !same_bytes(reinterpret_cast<const char *>(loaded.phdr), reinterpret_cast<const char *>(phdrs.data()),
                    phdrs.size() * sizeof(ElfW(Phdr))))
        return false;
    // Text relocations rewrite code as it loads: compare only what they cannot touch.
    const bool textrel = has_text_relocations(map->l_ld);
    std::vector<char> buf(64 << 10);
    size_t compared = 0;
    for (const auto &ph : phdrs) {
        if (ph.p_type != PT_LOAD || (ph.p_flags & PF_W) || !(ph.p_flags & PF_R)) continue;
        if (textrel && (ph.p_flags & PF_X)) continue;
        const char *mem = reinterpret_cast<const char *>(map->l_addr + ph.p_vaddr);
        for (size_t off = 0; off < ph.p_filesz; off += buf.size()) {
            size_t n = std::min(buf.size(), static_cast<size_t>(ph.p_filesz) - off);
            if (!read_exact(fd, buf.data(), n, static_cast<off_t>(ph.p_offset + off))) return false;
            if (!same_bytes(mem + off, buf.data(), n)) return false;
        }
        compared += ph.p_filesz;
    }
    return compared > 0;
}

}  // namespace

Result<SharedLibrary> SharedLibrary::load_fd(int fd, const std::string &path) {
    std::vector<Fd> tried;  // held open until done, so each try gets a number of its own
    int number = fd;
    for (int attempt = 0; attempt < kNamesToTry; ++attempt) {
        const std::string name = cat("/proc/self/fd/", number);
        dlerror();
        void *handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle) {
            const char *e = dlerror();
            std::string text = e ? e : "dlopen failed without a message";
            // The loader speaks of the descriptor; the user knows the file.
            for (size_t at = 0; (at = text.find(name, at)) != std::string::npos; at += path.size())
                text.replace(at, name.size(), path);
            if (::access("/proc/self/fd", X_OK) != 0)
                text +=
                    "; plugins are loaded through /proc/self/fd, and /proc is not mounted here: mount -t proc "
                    "proc /proc";
            return fail(-ENOEXEC, text);
        }
        if (is_file(handle, fd)) return SharedLibrary(handle);
        ::dlclose(handle);
        FERRY_DEBUG("dlopen(", name, ") for ", path,
                    " returned another library loaded under that name; trying another");
        Fd next(::fcntl(fd, F_DUPFD_CLOEXEC, number + 1));
        if (!next) return fail(-errno, cat("cannot duplicate the descriptor of ", path, ": ", std::strerror(errno)));
        number = next.get();
        tried.push_back(std::move(next));
    }
    return fail(-EEXIST, cat("the dynamic loader answered ", kNamesToTry, " names of ", path,
                             " (/proc/self/fd/N) with other libraries it had loaded under them"));
}

void *SharedLibrary::symbol(const char *name) const { return handle_ ? ::dlsym(handle_, name) : nullptr; }

void SharedLibrary::reset() {
    if (handle_) ::dlclose(handle_);
    handle_ = nullptr;
}

}  // namespace ferry
