// gds.so's transport: CUDA memory to and from the file of a storage segment through cuFile. A
// few worker threads run cuFileRead/cuFileWrite (synchronous calls; in GDS mode the NVMe DMAs
// straight into GPU memory), each op cut into requests of max_io_bytes spread over them, short
// transfers completed. CUDA regions are registered with cuFile (cuFileBufRegister) when first
// used, so requests skip cuFile's internal bounce buffers where the driver allows.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cufile_api.hpp"
#include "option_table.hpp"
#include "plugin_util.hpp"
#include "storage_plugin.hpp"

namespace ferry_gds {

struct Config {
    unsigned threads = 4;                 // workers issuing cuFile calls
    uint64_t max_io_bytes = 16ull << 20;  // a larger op is cut into requests of this size
    bool register_buffers = true;         // cuFileBufRegister each CUDA region
    bool create = false;                  // open_segment creates a missing file (mode 0600)
};
inline constexpr size_t kOptionCount = 4;
extern const ferry_plugin::OptionTable<Config, kOptionCount> kOptions;

struct Region {
    uint64_t addr = 0, length = 0;
    int device = 0;
    enum class State { NotYet, Registering, Registered, Refused } state = State::NotYet;  // with cuFile
    unsigned inflight = 0;
};

struct File {
    std::string path;
    int fd = -1;
    CUfileHandle handle = nullptr;
    bool writable = false;
    unsigned inflight = 0;
};

struct Op {
    uint64_t user_data = 0;
    unsigned left = 0;
    int status = 0;
    std::string message;
};

struct Request {
    Op *op = nullptr;
    File *file = nullptr;
    Region *region = nullptr;
    bool write = false;
    uint64_t offset = 0, addr = 0, length = 0;
};

class Transport : public StoragePeerless {
public:
    static constexpr const char *kName = "gds";
    static int probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result);
    static int create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err);
    ~Transport();

    int register_mem(const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err);
    int deregister_mem(uint64_t handle, ferry_error_t *err);
    int connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err);
    int disconnect(uint64_t peer, ferry_error_t *err);
    int import_mem(uint64_t peer, const ferry_mem_region_t *, const void *, size_t, uint64_t *remote_mem,
                   ferry_error_t *err);
    int submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err);
    int poll(ferry_completion_t *out, size_t max) { return static_cast<int>(done_.poll(out, max)); }
    int completion_fd() const { return done_.fd(); }

private:
    Transport(const Config &cfg, const ferry_host_api_t *host) : cfg_(cfg), log_(host, kName) {}
    void worker();
    void register_once(Region &region);  // cuFileBufRegister on first use, in the worker's context
    int run(const Request &r, std::string &message);
    void finish(const Request &r, int status, const std::string &message);

    Config cfg_;
    Logger log_;
    CuFile api_{};
    bool driver_open_ = false;
    CompletionQueue done_;
    std::mutex mu_;
    std::condition_variable work_cv_, idle_cv_;
    std::deque<Request> queue_;
    bool stopping_ = false;
    std::unordered_map<uint64_t, std::unique_ptr<Region>> regions_;
    std::unordered_map<uint64_t, std::unique_ptr<File>> files_;
    uint64_t next_id_ = 1;
    std::vector<std::thread> workers_;
};

}  // namespace ferry_gds
