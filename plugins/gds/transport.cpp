#include "transport.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry_gds {

using ferry_plugin::OptionValue;
using ferry_plugin::store;

// clang-format off
constexpr ferry_plugin::OptionTable<Config, kOptionCount> kOptions = ferry_plugin::make_options<Config>("gds",
    ferry_plugin::uint_option<Config>("threads", "4", 1, 256,
        "workers issuing cuFile calls: requests in flight at once", store<&Config::threads>),
    ferry_plugin::size_option<Config>("max_io_bytes", "16m", 4096, 1ull << 30,
        "a larger op is cut into cuFile requests of this size, spread over the workers", store<&Config::max_io_bytes>),
    ferry_plugin::bool_option<Config>("register_buffers", "true",
        "register each CUDA region with cuFile (cuFileBufRegister) at its first use, so requests skip bounce buffers",
        store<&Config::register_buffers>),
    ferry_plugin::bool_option<Config>("create", "false",
        "open_segment(\"file:<path>\") creates a missing file (mode 0600) instead of failing", store<&Config::create>));
// clang-format on

namespace {

std::string cuda_text(cudaError_t rc) { return std::string(cudaGetErrorString(rc)) + " (" + std::to_string(rc) + ")"; }

}  // namespace

int Transport::probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
    Config cfg;
    ferry_error_t err{};
    result->available = 0;
    if (kOptions.parse(options, n, cfg, &err) != 0) {
        copy_message(result->reason, err.message);
        return 0;
    }
    CuFile api{};
    std::string why;
    if (!load_cufile(api, why)) {
        copy_message(result->reason, why.c_str());
        return 0;
    }
    ::dlclose(api.library);
    int count = 0;
    if (cudaError_t rc = cudaGetDeviceCount(&count); rc != cudaSuccess || count == 0) {
        cudaGetLastError();
        copy_message(result->reason, ("no CUDA GPU: " + (rc != cudaSuccess ? cuda_text(rc) : "0 devices")).c_str());
        return 0;
    }
    result->available = 1;
    copy_message(result->reason, strprintf("cuFile, %d GPUs; %s", count, cufile_mode().c_str()).c_str());
    return 0;
}

int Transport::create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err) {
    Config cfg;
    if (int rc = kOptions.parse(options, n, cfg, err)) return rc;
    std::unique_ptr<Transport> t(new Transport(cfg, host));
    std::string why;
    if (!load_cufile(t->api_, why)) return set_error(err, -ENOENT, "gds: %s", why.c_str());
    CUfileError e = t->api_.driver_open();
    if (e.err != kCuFileSuccess)
        return set_error(err, -EIO, "gds: cuFileDriverOpen: %s%s", cufile_error_text(e.err).c_str(),
                         " (see cufile.log; without nvidia-fs, cufile.json must allow compat mode)");
    t->driver_open_ = true;
    t->log_.log(FERRY_LOG_INFO, "cuFile driver open: %s", cufile_mode().c_str());
    for (unsigned i = 0; i < cfg.threads; ++i) t->workers_.emplace_back([p = t.get()] { p->worker(); });
    *out = t.release();
    return 0;
}

Transport::~Transport() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
        work_cv_.notify_all();
    }
    for (auto &w : workers_) w.join();  // each ends its cuFile call first: the kernel may be writing
    for (auto &[id, f] : files_) {
        if (f->handle) api_.handle_deregister(f->handle);
        ::close(f->fd);
    }
    for (auto &[id, r] : regions_)
        if (r->state == Region::State::Registered) (void)api_.buf_deregister(reinterpret_cast<void *>(r->addr));
    if (driver_open_) (void)api_.driver_close();
    if (api_.library) ::dlclose(api_.library);
}

int Transport::register_mem(const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err) {
    if (r->kind != FERRY_MEM_CUDA)
        return set_error(err, -ENOTSUP, "gds: register_mem: CUDA memory only (file.so moves host memory)");
    auto region = std::make_unique<Region>();
    region->addr = r->addr;
    region->length = r->length;
    region->device = r->device_id;
    // Registered with cuFile on first use (a worker, in the device's context): the engine
    // registers every CUDA region with every transport that moves it, and one that never meets
    // a file should not take cuFile's pinned BAR space.
    std::lock_guard lock(mu_);
    *handle = next_id_++;
    regions_[*handle] = std::move(region);
    return 0;
}

int Transport::deregister_mem(uint64_t handle, ferry_error_t *err) {
    std::unique_lock lock(mu_);
    auto it = regions_.find(handle);
    if (it == regions_.end()) return set_error(err, -EINVAL, "gds: deregister_mem: unknown handle");
    Region *r = it->second.get();
    idle_cv_.wait(lock, [&] { return r->inflight == 0; });  // a worker may be inside cuFileRead on it
    if (r->state == Region::State::Registered) (void)api_.buf_deregister(reinterpret_cast<void *>(r->addr));
    regions_.erase(it);
    return 0;
}

int Transport::connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err) {
    std::string path(static_cast<const char *>(endpoint), len);
    if (path.find(',') != std::string::npos)
        return set_error(err, -ENOTSUP, "gds: %s: striped segments are file.so's (GPU memory is staged there)",
                         path.c_str());
    auto f = std::make_unique<File>();
    f->path = path;
    // GDS proper needs O_DIRECT; where the filesystem refuses it (tmpfs), compat mode still works.
    int create = cfg_.create ? O_CREAT : 0;
    for (int direct : {O_DIRECT, 0}) {
        f->fd = ::open(path.c_str(), O_CLOEXEC | O_RDWR | direct | create, 0600);
        f->writable = f->fd >= 0;
        if (f->fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM))
            f->fd = ::open(path.c_str(), O_CLOEXEC | O_RDONLY | direct);
        if (f->fd >= 0 || errno != EINVAL) break;
    }
    if (f->fd < 0)
        return set_error(err, -errno, "gds: open %s: %s%s", path.c_str(), errno_string(errno).c_str(),
                         errno == ENOENT ? "; create the file first, or set gds.create=true" : "");
    struct stat st {};
    if (::fstat(f->fd, &st) != 0 || (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode))) {
        ::close(f->fd);
        return set_error(err, -EINVAL, "gds: %s is neither a regular file nor a block device", path.c_str());
    }
    CUfileDescr d{};
    d.type = kCuFileHandleTypeOpaqueFd;
    d.handle.fd = f->fd;
    CUfileError e = api_.handle_register(&f->handle, &d);
    if (e.err != kCuFileSuccess) {
        ::close(f->fd);
        return set_error(err, -EIO, "gds: cuFileHandleRegister(%s): %s", path.c_str(),
                         cufile_error_text(e.err).c_str());
    }
    std::lock_guard lock(mu_);
    *peer = next_id_++;
    files_[*peer] = std::move(f);
    return 0;
}

int Transport::disconnect(uint64_t peer, ferry_error_t *err) {
    std::unique_lock lock(mu_);
    auto it = files_.find(peer);
    if (it == files_.end()) return set_error(err, -EINVAL, "gds: disconnect: unknown segment");
    File *f = it->second.get();
    // Queued requests end now; those inside cuFile end as they do, then the file closes.
    std::vector<Request> dropped;
    std::deque<Request> kept;
    for (auto &q : queue_) (q.file == f ? dropped.push_back(q) : kept.push_back(q));
    queue_.swap(kept);
    lock.unlock();
    for (auto &r : dropped) finish(r, -ECANCELED, "the segment was closed");
    lock.lock();
    idle_cv_.wait(lock, [&] { return f->inflight == 0; });
    api_.handle_deregister(f->handle);
    ::close(f->fd);
    files_.erase(peer);
    return 0;
}

int Transport::import_mem(uint64_t peer, const ferry_mem_region_t *, const void *, size_t, uint64_t *remote_mem,
                          ferry_error_t *err) {
    std::lock_guard lock(mu_);
    if (!files_.count(peer)) return set_error(err, -EINVAL, "gds: import_mem: unknown segment");
    *remote_mem = peer;
    return 0;
}

int Transport::submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto f = files_.find(peer);
    if (f == files_.end()) return set_error(err, -EINVAL, "gds: submit: segment is not open");
    std::vector<Region *> regions(n);
    for (size_t i = 0; i < n; ++i) {
        auto r = regions_.find(ops[i].local_mem);
        if (r == regions_.end() || ops[i].local_addr < r->second->addr ||
            ops[i].local_addr + ops[i].length > r->second->addr + r->second->length)
            return set_error(err, -EINVAL, "gds: submit: op %zu's local range is not inside its registered region", i);
        regions[i] = r->second.get();
    }
    for (size_t i = 0; i < n; ++i) {
        auto *op = new Op{ops[i].user_data, 0, 0, {}};
        for (uint64_t at = 0; at < ops[i].length; at += cfg_.max_io_bytes) {
            Request r{op,
                      f->second.get(),
                      regions[i],
                      ops[i].opcode == FERRY_OP_WRITE,
                      ops[i].remote_addr + at,
                      ops[i].local_addr + at,
                      std::min(cfg_.max_io_bytes, ops[i].length - at)};
            ++op->left;
            ++r.file->inflight;
            ++r.region->inflight;
            queue_.push_back(r);
        }
    }
    work_cv_.notify_all();
    return 0;
}

void Transport::worker() {
    int device = -1;
    for (;;) {
        Request r;
        {
            std::unique_lock lock(mu_);
            work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) return;
            r = queue_.front();
            queue_.pop_front();
        }
        // cuFile works in the calling thread's CUDA context: the region's device's.
        if (r.region->device != device) {
            cudaSetDevice(r.region->device);
            device = r.region->device;
        }
        register_once(*r.region);
        std::string message;
        int status = run(r, message);
        finish(r, status, message);
    }
}

void Transport::register_once(Region &region) {
    {
        std::lock_guard lock(mu_);
        if (!cfg_.register_buffers || region.state != Region::State::NotYet) return;
        region.state = Region::State::Registering;  // others go unregistered meanwhile
    }
    CUfileError e = api_.buf_register(reinterpret_cast<void *>(region.addr), region.length, 0);
    if (e.err != kCuFileSuccess)  // cuFile then bounces through its own buffers: slower, correct
        log_.log(FERRY_LOG_INFO, "cuFileBufRegister(0x%llx, %llu): %s; requests on it use bounce buffers",
                 static_cast<unsigned long long>(region.addr), static_cast<unsigned long long>(region.length),
                 cufile_error_text(e.err).c_str());
    std::lock_guard lock(mu_);
    region.state = e.err == kCuFileSuccess ? Region::State::Registered : Region::State::Refused;
}

int Transport::run(const Request &r, std::string &message) {
    auto describe = [&](uint64_t done, const std::string &what) {
        message = strprintf("%s of %s at offset %llu (%llu bytes): %s", r.write ? "WRITE" : "READ",
                            r.file->path.c_str(), static_cast<unsigned long long>(r.offset + done),
                            static_cast<unsigned long long>(r.length - done), what.c_str());
    };
    if (r.write && !r.file->writable) {
        describe(0, "the file is open read-only: this process may not write it");
        return -EBADF;
    }
    // With a registered region cuFile takes its base and an offset into it; else the address.
    bool registered;
    {
        std::lock_guard lock(mu_);
        registered = r.region->state == Region::State::Registered;
    }
    void *base = reinterpret_cast<void *>(registered ? r.region->addr : r.addr);
    uint64_t base_off = registered ? r.addr - r.region->addr : 0;
    for (uint64_t done = 0; done < r.length;) {
        ssize_t n = r.write ? api_.write(r.file->handle, base, r.length - done, static_cast<off_t>(r.offset + done),
                                         static_cast<off_t>(base_off + done))
                            : api_.read(r.file->handle, base, r.length - done, static_cast<off_t>(r.offset + done),
                                        static_cast<off_t>(base_off + done));
        if (n > 0) {
            done += static_cast<uint64_t>(n);
            continue;
        }
        if (n == 0) {
            describe(done,
                     r.write ? "cuFileWrite wrote 0 bytes" : "the file ends before it; READ only what was written");
            return r.write ? -EIO : -ENODATA;
        }
        if (n == -1) {  // a POSIX error, in errno
            int e = errno;
            describe(done, errno_string(e) + (e == ENOSPC ? "; free space on the file's filesystem" : ""));
            return -e;
        }
        describe(done, (r.write ? "cuFileWrite: " : "cuFileRead: ") + cufile_error_text(static_cast<int>(-n)));
        return -EIO;
    }
    return 0;
}

void Transport::finish(const Request &r, int status, const std::string &message) {
    std::lock_guard lock(mu_);
    Op *op = r.op;
    if (status && !op->status) {
        op->status = status;
        op->message = message;
    }
    --r.file->inflight;
    --r.region->inflight;
    idle_cv_.notify_all();
    if (--op->left == 0) {
        done_.push(op->user_data, op->status, op->message);
        delete op;
    }
}

}  // namespace ferry_gds
