#include "harness.hpp"

#include "../peer_pattern.hpp"

#include <dlfcn.h>
#include <poll.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace ferry_test {

void PrintTo(const TransportParam &p, std::ostream *os) {
    *os << p.name << " {";
    for (const auto &[k, v] : p.options) *os << " " << k << "=" << v;
    *os << " }";
}

Plugin::Plugin(const std::string &path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
        const char *e = dlerror();
        error_ = "dlopen " + path + ": " + (e ? e : "?");
        return;
    }
    auto *api = static_cast<const ferry_plugin_v1_t *>(dlsym(handle_, FERRY_PLUGIN_SYMBOL_V1));
    if (api == nullptr) {
        error_ = path + " does not export " FERRY_PLUGIN_SYMBOL_V1;
        return;
    }
    if ((api->abi_version >> 16) != FERRY_PLUGIN_ABI_MAJOR ||
        api->struct_size < FERRY_PLUGIN_V1_SIZE_UNTIL(completion_fd)) {
        error_ = path + ": unexpected ABI version or struct size";
        return;
    }
    api_ = api;
}

Plugin::~Plugin() {
    // Not dlclose'd: plugins may leave thread-local destructors registered, and the process
    // ends soon anyway.
}

Buffer::Buffer(size_t len) : len_(len) {
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    p_ = static_cast<uint8_t *>(p);
}

Buffer::~Buffer() { munmap(p_, len_); }

namespace {
uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
uint8_t pattern_at(uint64_t seed, uint64_t i) {
    return static_cast<uint8_t>(splitmix(seed * 0x100000001b3ull + (i >> 3)) >> (8 * (i & 7)));
}
}  // namespace

FERRY_TEST_ORDERED_ELSEWHERE void fill_pattern(uint8_t *p, size_t len, uint64_t seed, uint64_t first) {
    size_t i = 0;
    for (; i < len && ((first + i) & 7) != 0; ++i) p[i] = pattern_at(seed, first + i);
    for (; i + 8 <= len; i += 8) {
        uint64_t w = splitmix(seed * 0x100000001b3ull + ((first + i) >> 3));
        memcpy(p + i, &w, 8);  // little-endian: byte k of w is index first+i+k
    }
    for (; i < len; ++i) p[i] = pattern_at(seed, first + i);
}

FERRY_TEST_ORDERED_ELSEWHERE size_t find_mismatch(const uint8_t *p, size_t len, uint64_t seed, uint64_t first) {
    for (size_t i = 0; i < len; ++i)
        if (p[i] != pattern_at(seed, first + i)) return i;
    return SIZE_MAX;
}

uint64_t fnv1a(const uint8_t *p, size_t len) { return ferry::test::fnv1a(p, len); }

namespace {
void log_to_stderr(void *, int level, const char *plugin, const char *message) {
    fprintf(stderr, "[%s %d] %s\n", plugin, level, message);
}
}  // namespace

ferry_host_api_t *test_host() {
    static ferry_host_api_t host{sizeof(ferry_host_api_t),
                                 0,
                                 nullptr,
                                 log_to_stderr,
                                 FERRY_LOG_WARN,
                                 0,
                                 nullptr,
                                 nullptr,
                                 nullptr};  // no staging
    return &host;
}

Instance::Instance(const Plugin &plugin, const Options &options) : Instance(plugin, options, test_host()) {}

Instance::Instance(const Plugin &plugin, const Options &options, const ferry_host_api_t *host) : api_(plugin.api()) {
    std::vector<ferry_kv_t> kv;
    for (const auto &[k, v] : options) kv.push_back({k.c_str(), v.c_str()});
    ferry_error_t e{};
    ferry_transport_t *t = nullptr;
    create_rc_ = api_->create(kv.data(), kv.size(), host, &t, &e);
    if (create_rc_ == 0) t_ = t;
    else set_error(e.message);
}

Instance::~Instance() { destroy(); }

void Instance::destroy() {
    if (t_ != nullptr) api_->destroy(t_);
    t_ = nullptr;
}

std::vector<uint8_t> Instance::endpoint() {
    size_t len = 0;
    ferry_error_t e{};
    int rc = api_->export_endpoint(t_, nullptr, &len, &e);
    if (rc != -ENOSPC && rc != 0) throw std::runtime_error(std::string("export_endpoint: ") + e.message);
    std::vector<uint8_t> buf(len);
    rc = api_->export_endpoint(t_, buf.data(), &len, &e);
    if (rc != 0) throw std::runtime_error(std::string("export_endpoint: ") + e.message);
    buf.resize(len);
    return buf;
}

#define CALL(expr)                      \
    ferry_error_t e{};                  \
    int rc = (expr);                    \
    set_error(rc < 0 ? e.message : ""); \
    return rc

int Instance::register_mem(const void *addr, uint64_t len, uint32_t access, uint64_t *handle, uint32_t kind) {
    ferry_mem_region_t r{reinterpret_cast<uint64_t>(addr), len, kind, kind == FERRY_MEM_HOST ? -1 : 0, access, 0};
    CALL(api_->register_mem(t_, &r, handle, &e));
}

int Instance::deregister_mem(uint64_t handle) { CALL(api_->deregister_mem(t_, handle, &e)); }

int Instance::connect(const std::vector<uint8_t> &ep, uint64_t *peer) {
    CALL(api_->connect(t_, ep.data(), ep.size(), peer, &e));
}

int Instance::disconnect(uint64_t peer) { CALL(api_->disconnect(t_, peer, &e)); }

int Instance::import_mem(uint64_t peer, uint64_t addr, uint64_t len, uint32_t access, uint64_t *remote_mem,
                         uint32_t kind) {
    ferry_mem_region_t r{addr, len, kind, kind == FERRY_MEM_HOST ? -1 : 0, access, 0};
    CALL(api_->import_mem(t_, peer, &r, nullptr, 0, remote_mem, &e));
}

int Instance::submit(uint64_t peer, const std::vector<ferry_xfer_op_t> &ops) {
    CALL(api_->submit(t_, peer, ops.data(), ops.size(), &e));
}

std::vector<ferry_completion_t> Instance::wait(size_t n, std::chrono::milliseconds limit) {
    std::vector<ferry_completion_t> got;
    int fd = -1;
    ferry_error_t e{};
    if (api_->completion_fd(t_, &fd, &e) != 0) fd = -1;
    auto deadline = std::chrono::steady_clock::now() + limit;
    std::vector<ferry_completion_t> buf(64);
    while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
        int k = api_->poll(t_, buf.data(), buf.size(), &e);
        if (k < 0) {
            set_error(e.message);
            break;
        }
        got.insert(got.end(), buf.begin(), buf.begin() + k);
        if (k > 0) continue;
        if (fd >= 0) {
            pollfd p{fd, POLLIN, 0};
            ::poll(&p, 1, 100);
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    return got;
}

ferry_xfer_op_t make_op(uint32_t opcode, uint64_t local_addr, uint64_t local_mem, uint64_t remote_addr,
                        uint64_t remote_mem, uint64_t len, uint64_t user_data) {
    ferry_xfer_op_t op{};
    op.opcode = opcode;
    op.local_addr = local_addr;
    op.local_mem = local_mem;
    op.remote_addr = remote_addr;
    op.remote_mem = remote_mem;
    op.length = len;
    op.user_data = user_data;
    return op;
}

}  // namespace ferry_test
