#include "loader/library_path.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace ferry {
namespace {

bool readable(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), R_OK) == 0;
}

// The cache entry of `soname` for this machine's ABI in ld.so.cache's "glibc-ld.so.cache1.1"
// format (alone, or after the old format's table): a 48-byte header, then 24-byte entries
// whose string offsets count from the header.
std::optional<std::string> from_ld_so_cache(const std::string &soname) {
    std::ifstream in("/etc/ld.so.cache", std::ios::binary | std::ios::ate);
    if (!in) return std::nullopt;
    // One read of the whole file (istreambuf_iterator copied it a character at a time: the
    // runtime probe looks up eight sonames, and this was most of its time).
    std::string data(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)), '\0');
    in.seekg(0);
    if (!in.read(data.data(), static_cast<std::streamsize>(data.size()))) return std::nullopt;
    static constexpr char kMagic[] = "glibc-ld.so.cache1.1";
    size_t base = data.find(kMagic, 0, sizeof kMagic - 1);
    if (base == std::string::npos || base + 48 > data.size()) return std::nullopt;
    auto u32 = [&](size_t at) {
        uint32_t v;
        memcpy(&v, data.data() + at, sizeof v);
        return v;
    };
    auto text = [&](uint32_t offset) -> std::string {
        if (base + offset >= data.size()) return {};
        const char *s = data.data() + base + offset;
        return std::string(s, strnlen(s, data.size() - base - offset));
    };
#if defined(__x86_64__)
    constexpr uint32_t kArch = 0x0303;  // FLAG_ELF_LIBC6 | FLAG_X8664_LIB64
#elif defined(__aarch64__)
    constexpr uint32_t kArch = 0x0a03;  // FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64
#else
    constexpr uint32_t kArch = 0;
#endif
    uint32_t count = u32(base + 20);
    for (uint32_t i = 0; i < count && base + 48 + (i + 1) * 24 <= data.size(); ++i) {
        size_t entry = base + 48 + i * 24;
        if (kArch && (u32(entry) & 0xffff) != kArch) continue;
        uint32_t key = u32(entry + 4);
        if (base + key >= data.size() ||
            strncmp(data.data() + base + key, soname.c_str(), data.size() - base - key) != 0)
            continue;
        std::string path = text(u32(entry + 8));
        if (readable(path)) return path;
    }
    return std::nullopt;
}

}  // namespace

std::optional<std::string> loader_would_find(const std::string &soname) {
    if (soname.empty() || soname.find('/') != std::string::npos) return std::nullopt;  // not a search
    if (const char *env = std::getenv("LD_LIBRARY_PATH")) {
        std::string list = env;
        for (size_t start = 0; start <= list.size();) {
            size_t end = std::min(list.find_first_of(":;", start), list.size());
            if (end > start) {
                std::string path = list.substr(start, end - start) + "/" + soname;
                if (readable(path)) return path;
            }
            start = end + 1;
        }
    }
    if (auto path = from_ld_so_cache(soname)) return path;
    for (const char *dir :
         {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}) {
        std::string path = std::string(dir) + "/" + soname;
        if (readable(path)) return path;
    }
    return std::nullopt;
}

}  // namespace ferry
