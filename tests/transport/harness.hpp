// Plugin-level test harness: loads a transport plugin with plain dlopen/dlsym (no core) and
// drives it through the ferry_plugin_v1_t ABI. Reusable for every transport.
#pragma once

#include <ferry/plugin.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace ferry_test {

using Options = std::vector<std::pair<std::string, std::string>>;

// One transport under test.
struct TransportParam {
    std::string name;    // plugin name, e.g. "tcp"
    std::string path;    // path to <name>.so
    Options options;     // given to every instance the tests create
    uint64_t slice = 0;  // slice size the options set (sizes around it are tested), 0: none
    Options bad_option;  // one option value create() must reject, naming the key
    // Options that make a new instance listen where `endpoint` (bytes) pointed, to test
    // reconnecting to a restarted peer; empty result: not supported (test skipped).
    Options (*same_endpoint_options)(const std::vector<uint8_t> &endpoint) = nullptr;
    // Substring every peer-failure message must contain for a peer at 127.0.0.1, or "".
    std::string peer_in_messages;
    // Completion status of a request the serving side refuses, 0: any negative code.
    int refuse_range_code = 0;   // outside every registered region
    int refuse_access_code = 0;  // inside a region without the access right
    // Peers only in this process (the example's memcpy transport): the cross-process tests skip.
    bool same_process_only = false;
};

// gtest prints parameters with this (instead of a byte dump).
void PrintTo(const TransportParam &p, std::ostream *os);

// dlopen'ed plugin. Skips nothing itself: check ok() and error().
class Plugin {
public:
    explicit Plugin(const std::string &path);
    ~Plugin();
    Plugin(const Plugin &) = delete;
    Plugin &operator=(const Plugin &) = delete;
    bool ok() const { return api_ != nullptr; }
    const std::string &error() const { return error_; }
    const ferry_plugin_v1_t *operator->() const { return api_; }
    const ferry_plugin_v1_t *api() const { return api_; }

private:
    void *handle_ = nullptr;
    const ferry_plugin_v1_t *api_ = nullptr;
    std::string error_;
};

// Page-aligned anonymous memory, unmapped on destruction.
class Buffer {
public:
    explicit Buffer(size_t len);
    ~Buffer();
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    uint8_t *data() const { return p_; }
    uint64_t addr() const { return reinterpret_cast<uint64_t>(p_); }
    size_t size() const { return len_; }

private:
    uint8_t *p_ = nullptr;
    size_t len_ = 0;
};

// Deterministic bytes: the value at index i of stream `seed`.
void fill_pattern(uint8_t *p, size_t len, uint64_t seed, uint64_t first_index = 0);
// Index of the first byte that differs from the pattern, or SIZE_MAX.
size_t find_mismatch(const uint8_t *p, size_t len, uint64_t seed, uint64_t first_index = 0);
uint64_t fnv1a(const uint8_t *p, size_t len);

ferry_host_api_t *test_host();  // logs WARN and above to stderr

// Reads a byte that a transport thread may be writing at this moment, to watch a transfer in
// progress. The test means to race with the writer, so ThreadSanitizer does not instrument it.
__attribute__((no_sanitize("thread"))) inline uint8_t watch_byte(const uint8_t *p) {
    return *static_cast<const volatile uint8_t *>(p);
}

// A transport instance. All calls return the plugin's code; the last error message is kept.
class Instance {
public:
    Instance(const Plugin &plugin, const Options &options);
    // With a host of the test's own (staging_host.hpp); it must outlive the instance.
    Instance(const Plugin &plugin, const Options &options, const ferry_host_api_t *host);
    ~Instance();
    Instance(const Instance &) = delete;
    Instance &operator=(const Instance &) = delete;

    int create_rc() const { return create_rc_; }
    ferry_transport_t *t() const { return t_; }
    // The message of the last failed call from any thread (tests submit from several).
    std::string last_error() const {
        std::lock_guard<std::mutex> lock(err_mu_);
        return err_;
    }

    std::vector<uint8_t> endpoint();
    int register_mem(const void *addr, uint64_t len, uint32_t access, uint64_t *handle, uint32_t kind = FERRY_MEM_HOST);
    int deregister_mem(uint64_t handle);
    int connect(const std::vector<uint8_t> &endpoint, uint64_t *peer);
    int disconnect(uint64_t peer);
    int import_mem(uint64_t peer, uint64_t addr, uint64_t len, uint32_t access, uint64_t *remote_mem,
                   uint32_t kind = FERRY_MEM_HOST);
    int submit(uint64_t peer, const std::vector<ferry_xfer_op_t> &ops);
    // Collects completions until `n` arrived, sleeping on completion_fd (or polling) in
    // between. Gives up after `limit` (a hang guard, not a timing check).
    std::vector<ferry_completion_t> wait(size_t n, std::chrono::milliseconds limit = std::chrono::seconds(60));
    // Destroys the transport now (the destructor then does nothing).
    void destroy();

private:
    const ferry_plugin_v1_t *api_;
    ferry_transport_t *t_ = nullptr;
    int create_rc_ = 0;
    void set_error(const char *message) {
        std::lock_guard<std::mutex> lock(err_mu_);
        err_ = message;
    }
    mutable std::mutex err_mu_;
    std::string err_;
};

ferry_xfer_op_t make_op(uint32_t opcode, uint64_t local_addr, uint64_t local_mem, uint64_t remote_addr,
                        uint64_t remote_mem, uint64_t len, uint64_t user_data);

}  // namespace ferry_test
