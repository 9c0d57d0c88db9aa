// Helpers of the storage segment suites (file_segment_test, file_failure_test): engines with
// file.so alone, directories on the real disk and on tmpfs, files read back with pread.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ferry/engine.hpp"

namespace ferry::test {

constexpr long kTmpfsMagic = 0x01021994;

inline bool on_tmpfs(const std::string &dir) {
    struct statfs fs {};
    return ::statfs(dir.c_str(), &fs) == 0 && fs.f_type == kTmpfsMagic;
}

// A directory made for one test, removed with what it holds: under `parent`.
class ScratchDir {
public:
    explicit ScratchDir(const std::string &parent) {
        std::string tmpl = parent + "/ferry-file-XXXXXX";
        if (::mkdtemp(tmpl.data())) path_ = tmpl;
    }
    ~ScratchDir() {
        std::error_code ec;
        if (!path_.empty()) std::filesystem::remove_all(path_, ec);
    }
    bool ok() const { return !path_.empty(); }
    std::string operator/(const std::string &name) const { return path_ + "/" + name; }
    const std::string &path() const { return path_; }

private:
    std::string path_;
};

inline Result<std::unique_ptr<Engine>> file_engine(Config extra = {}) {
    Config c{{"plugins", "file"}};
    for (auto &[k, v] : extra) c[k] = v;
    return Engine::create(c);
}

inline void make_file(const std::string &path, size_t bytes, char fill = 0) {
    std::vector<char> data(bytes, fill);
    int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
    ASSERT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    ::close(fd);
}

inline std::vector<char> read_file(const std::string &path, uint64_t offset, size_t bytes) {
    std::vector<char> out(bytes);
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return {};
    ssize_t n = ::pread(fd, out.data(), bytes, static_cast<off_t>(offset));
    ::close(fd);
    out.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return out;
}

// Bytes nobody would write by chance: position and seed mixed.
inline void fill_pattern(char *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>((i * 131 + seed * 7919 + (i >> 9)) & 0xff);
}

// Memory aligned for O_DIRECT (a page), freed with the object.
struct AlignedBuffer {
    explicit AlignedBuffer(size_t n) : size(n) {
        data = static_cast<char *>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        std::memset(data, 0, n);
    }
    ~AlignedBuffer() { ::munmap(data, size); }
    AlignedBuffer(const AlignedBuffer &) = delete;
    AlignedBuffer &operator=(const AlignedBuffer &) = delete;
    char *data;
    size_t size;
};

// Runs the requests as one batch and waits for it.
inline Result<void> run_batch(Engine &e, const std::vector<Request> &reqs) {
    auto b = e.submit(reqs);
    if (!b) return std::unexpected(b.error());
    auto w = e.wait(*b, std::chrono::seconds(60));
    (void)e.free_batch(*b);
    return w;
}

inline Request op(Opcode code, void *local, SegmentId seg, uint64_t offset, uint64_t length) {
    return Request{code, local, seg, offset, length, {}};
}

}  // namespace ferry::test
