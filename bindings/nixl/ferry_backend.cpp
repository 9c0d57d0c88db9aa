#include "ferry_backend.hpp"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/nixl_log.h"
#include "config_sources.hpp"
#include "wire_format.hpp"

extern char **environ;

namespace ferry_nixl {
namespace {

// Where a Ferry error code leaves NIXL: a peer that went away makes NIXL drop the agent's
// metadata (NIXL_ERR_REMOTE_DISCONNECT), refused access and bad ranges are the caller's.
nixl_status_t to_nixl(int rc) {
    switch (-rc) {
        case 0: return NIXL_SUCCESS;
        case ECONNREFUSED:
        case ECONNRESET:
        case ECONNABORTED:
        case EPIPE:
        case ENOTCONN:
        case EHOSTUNREACH:
        case ENETUNREACH:
        case EHOSTDOWN: return NIXL_ERR_REMOTE_DISCONNECT;
        case EINVAL:
        case EFAULT:
        case ERANGE:
        case EMSGSIZE: return NIXL_ERR_INVALID_PARAM;
        case EACCES:
        case EPERM: return NIXL_ERR_NOT_ALLOWED;
        case ENOENT: return NIXL_ERR_NOT_FOUND;
        case ENOTSUP: return NIXL_ERR_NOT_SUPPORTED;
        case ECANCELED: return NIXL_ERR_CANCELED;
        default: return NIXL_ERR_BACKEND;
    }
}

std::string last_error() { return ferry_last_error(); }

const char *memory_name(uint32_t kind) {
    switch (kind) {
        case FERRY_MEMORY_HOST: return "host";
        case FERRY_MEMORY_CUDA: return "cuda";
        case FERRY_MEMORY_ROCM: return "rocm";
        default: return "unknown";
    }
}

// NIXL's own names for memory types live in libnixl, which this plugin does not link.
const char *nixl_memory_name(nixl_mem_t mem) {
    switch (mem) {
        case DRAM_SEG: return "DRAM_SEG";
        case VRAM_SEG: return "VRAM_SEG";
        case BLK_SEG: return "BLK_SEG";
        case OBJ_SEG: return "OBJ_SEG";
        case FILE_SEG: return "FILE_SEG";
    }
    return "unknown";
}

bool library_present(const char *soname) {
    void *h = dlopen(soname, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) h = dlopen(soname, RTLD_LAZY | RTLD_LOCAL);
    if (!h) return false;
    dlclose(h);
    return true;
}

}  // namespace

static std::string bundle_directory() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void *>(&bundle_directory), &info) == 0 || !info.dli_fname) return {};
    std::error_code ec;
    auto path = std::filesystem::weakly_canonical(info.dli_fname, ec);
    return (ec ? std::filesystem::path(info.dli_fname) : path).parent_path().string();
}

nixlFerryEngine::nixlFerryEngine(const nixlBackendInitParams *init_params) : nixlBackendEngine(init_params) {
    note_unused_settings(init_params);
    const auto &host_params = getCustomParams();
    LayeredConfig layered = layer_config({host_params.begin(), host_params.end()}, environ);
    std::string error;
    auto parsed = parse_backend_params(layered.values, layered.origin, error);
    if (!parsed) {
        NIXL_ERROR << "FERRY backend: " << error << " (configuration from " << layered.describe() << ")";
        initErr = true;
        return;
    }
    params_ = std::move(*parsed);
    params_.config_file = layered.config_file;

    std::vector<const char *> keys, values;
    for (const auto &[k, v] : params_.ferry_config) {
        keys.push_back(k.c_str());
        values.push_back(v.c_str());
    }
    ferry_engine_t *engine = nullptr;
    int rc = params_.config_file.empty() ? ferry_engine_create(keys.data(), values.data(), keys.size(), &engine)
                                         : ferry_engine_create_from_file(params_.config_file.c_str(), keys.data(),
                                                                         values.data(), keys.size(), &engine);
    if (rc != 0) {
        NIXL_ERROR << "FERRY backend: creating the Ferry engine for agent '" << localAgent
                   << "' failed: " << last_error() << " (configuration from " << layered.describe() << ")";
        initErr = true;
        return;
    }
    engine_.reset(engine);

    char name[512];
    if (int r = ferry_engine_segment_name(engine_.get(), name, sizeof name); r != 0) {
        NIXL_ERROR << "FERRY backend: reading the Ferry segment name failed: " << last_error();
        initErr = true;
        return;
    }
    segment_name_ = name;
    // What getBackendParams shows: the values taken from the environment, and where things came from.
    for (const auto &[key, from] : layered.origin)
        if (from != "parameter") (void)setInitParam(key, layered.values[key]);
    if (!layered.config_file.empty()) (void)setInitParam("config_file", layered.config_file);
    const std::string dir = bundle_directory();
    (void)setInitParam("note.sources", layered.describe());
    (void)setInitParam("note.plugin_dir", dir.empty() ? "(unknown)" : dir);
    (void)setInitParam("note.transport_dir", dir.empty() ? "(unknown)" : dir + "/ferry/plugins");
    (void)setInitParam("note.segment", segment_name_);
    NIXL_INFO << "FERRY backend: agent '" << localAgent << "' is Ferry segment " << segment_name_ << "; Ferry "
              << ferry_version() << " is linked into " << dir
              << "/libplugin_FERRY.so, transports searched in plugin_path, FERRY_PLUGIN_PATH, then " << dir
              << "/ferry/plugins; configuration from " << layered.describe();
}

nixlFerryEngine::~nixlFerryEngine() = default;  // ferry_engine_destroy closes segments and batches

uint32_t nixlFerryEngine::vram_memory_kind() {
    std::lock_guard lock(mutex_);
    if (!vram_kind_known_) {
        switch (params_.vram_kind) {
            case VramKind::Cuda: vram_kind_ = FERRY_MEMORY_CUDA; break;
            case VramKind::Rocm: vram_kind_ = FERRY_MEMORY_ROCM; break;
            case VramKind::Auto:
                // NIXL's VRAM_SEG does not say whose GPU; the driver library present does.
                vram_kind_ = !library_present("libcuda.so.1") && library_present("libamdhip64.so") ? FERRY_MEMORY_ROCM
                                                                                                   : FERRY_MEMORY_CUDA;
                break;
        }
        vram_kind_known_ = true;
    }
    return vram_kind_;
}

nixl_status_t nixlFerryEngine::registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) {
    uint32_t kind;
    int32_t device = -1;
    switch (nixl_mem) {
        case DRAM_SEG: kind = FERRY_MEMORY_HOST; break;
        case VRAM_SEG:
            kind = vram_memory_kind();
            device = static_cast<int32_t>(mem.devId);
            break;
        default:
            NIXL_ERROR << "FERRY backend: registerMem: memory type " << nixl_memory_name(nixl_mem)
                       << " is not supported (DRAM_SEG and VRAM_SEG are)";
            return NIXL_ERR_NOT_SUPPORTED;
    }
    if (mem.len == 0) {
        NIXL_ERROR << "FERRY backend: registerMem: descriptor at 0x" << std::hex << mem.addr
                   << " has length 0; register a non-empty buffer";
        return NIXL_ERR_INVALID_PARAM;
    }
    int rc =
        ferry_register(engine_.get(), reinterpret_cast<void *>(mem.addr), mem.len, kind, device, params_.remote_access);
    if (rc != 0) {
        NIXL_ERROR << "FERRY backend: registering " << mem.len << " bytes of " << memory_name(kind) << " memory at 0x"
                   << std::hex << mem.addr << std::dec << " failed: " << last_error();
        return to_nixl(rc);
    }
    out = new LocalRegion(mem.addr, mem.len, kind, device);
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::deregisterMem(nixlBackendMD *meta) {
    auto *region = dynamic_cast<LocalRegion *>(meta);
    if (!region) {
        NIXL_ERROR << "FERRY backend: deregisterMem was given metadata this backend did not create";
        return NIXL_ERR_INVALID_PARAM;
    }
    int rc = ferry_unregister(engine_.get(), reinterpret_cast<void *>(region->addr));
    if (rc != 0) {
        NIXL_ERROR << "FERRY backend: unregistering the region at 0x" << std::hex << region->addr << std::dec
                   << " failed: " << last_error();
        return to_nixl(rc);
    }
    delete region;
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::getConnInfo(std::string &str) const {
    str = encode_conn_info(segment_name_);
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::loadRemoteConnInfo(const std::string &remote_agent,
                                                  const std::string &remote_conn_info) {
    auto segment_name = decode_conn_info(remote_conn_info);
    if (!segment_name) {
        NIXL_ERROR << "FERRY backend: connection info of agent '" << remote_agent
                   << "' is not a FERRY backend's (wrong version or corrupted metadata)";
        return NIXL_ERR_MISMATCH;
    }
    ferry_segment_id_t segment = 0;
    if (int rc = ferry_open_segment(engine_.get(), segment_name->c_str(), &segment); rc != 0) {
        NIXL_ERROR << "FERRY backend: opening Ferry segment " << *segment_name << " of agent '" << remote_agent
                   << "' failed: " << last_error();
        return to_nixl(rc);
    }
    std::lock_guard lock(mutex_);
    agent_segments_[remote_agent] = segment;
    return NIXL_SUCCESS;
}

bool nixlFerryEngine::agent_segment(const std::string &agent, ferry_segment_id_t &segment) const {
    std::lock_guard lock(mutex_);
    if (agent == localAgent) {
        if (!has_self_segment_) return false;
        segment = self_segment_;
        return true;
    }
    auto it = agent_segments_.find(agent);
    if (it == agent_segments_.end()) return false;
    segment = it->second;
    return true;
}

nixl_status_t nixlFerryEngine::connect(const std::string &remote_agent) {
    if (remote_agent == localAgent) {
        // Local transfers go through this engine's own segment, like any other.
        ferry_segment_id_t segment = 0;
        if (int rc = ferry_open_segment(engine_.get(), segment_name_.c_str(), &segment); rc != 0) {
            NIXL_ERROR << "FERRY backend: opening this agent's own segment " << segment_name_
                       << " failed: " << last_error();
            return to_nixl(rc);
        }
        std::lock_guard lock(mutex_);
        self_segment_ = segment;
        has_self_segment_ = true;
        return NIXL_SUCCESS;
    }
    ferry_segment_id_t segment = 0;
    if (!agent_segment(remote_agent, segment)) {
        NIXL_ERROR << "FERRY backend: connect: no connection info for agent '" << remote_agent
                   << "'; load its metadata first";
        return NIXL_ERR_NOT_FOUND;
    }
    // Re-reading the peer's descriptor proves it is reachable and refreshes its region list.
    ferry_remote_region_t region;
    size_t count = 1;
    int rc = ferry_segment_regions(engine_.get(), segment, &region, &count);
    if (rc != 0 && rc != -ENOSPC) {
        NIXL_ERROR << "FERRY backend: connecting to agent '" << remote_agent << "' failed: " << last_error();
        return to_nixl(rc);
    }
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::disconnect(const std::string &remote_agent) {
    ferry_segment_id_t segment = 0;
    {
        std::lock_guard lock(mutex_);
        if (remote_agent == localAgent) return NIXL_SUCCESS;  // the own segment lives with the engine
        auto it = agent_segments_.find(remote_agent);
        if (it == agent_segments_.end()) return NIXL_SUCCESS;
        segment = it->second;
        agent_segments_.erase(it);
    }
    if (int rc = ferry_close_segment(engine_.get(), segment); rc != 0) {
        NIXL_ERROR << "FERRY backend: closing the segment of agent '" << remote_agent << "' failed: " << last_error();
        return to_nixl(rc);
    }
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::getPublicData(const nixlBackendMD *meta, std::string &str) const {
    auto *region = dynamic_cast<const LocalRegion *>(meta);
    if (!region) {
        NIXL_ERROR << "FERRY backend: getPublicData was given metadata this backend did not create";
        return NIXL_ERR_INVALID_PARAM;
    }
    str = encode_region({region->addr, region->length, region->memory_kind, region->device, segment_name_});
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::loadRemoteMD(const nixlBlobDesc &input, const nixl_mem_t &nixl_mem,
                                            const std::string &remote_agent, nixlBackendMD *&output) {
    auto region = decode_region(input.metaInfo);
    if (!region) {
        NIXL_ERROR << "FERRY backend: metadata of a region of agent '" << remote_agent
                   << "' is not a FERRY backend's (wrong version or corrupted metadata)";
        return NIXL_ERR_MISMATCH;
    }
    if (input.addr < region->addr || input.len > region->length ||
        input.addr - region->addr > region->length - input.len) {
        NIXL_ERROR << "FERRY backend: agent '" << remote_agent << "' describes [0x" << std::hex << input.addr << ", +0x"
                   << input.len << ") outside the region it registered [0x" << region->addr << ", +0x" << region->length
                   << ")" << std::dec;
        return NIXL_ERR_INVALID_PARAM;
    }
    ferry_segment_id_t segment = 0;
    if (!agent_segment(remote_agent, segment)) {
        NIXL_ERROR << "FERRY backend: no connection info for agent '" << remote_agent
                   << "'; its metadata must carry the FERRY backend's connection info";
        return NIXL_ERR_NOT_FOUND;
    }
    output = new TargetRegion(segment, input.addr, input.len);
    (void)nixl_mem;
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) {
    auto *region = dynamic_cast<LocalRegion *>(input);
    if (!region) {
        NIXL_ERROR << "FERRY backend: loadLocalMD was given metadata this backend did not create";
        return NIXL_ERR_INVALID_PARAM;
    }
    ferry_segment_id_t segment = 0;
    if (!agent_segment(localAgent, segment)) {
        NIXL_ERROR << "FERRY backend: local transfers need connect() to this agent first";
        return NIXL_ERR_NOT_FOUND;
    }
    output = new TargetRegion(segment, region->addr, region->length);
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::unloadMD(nixlBackendMD *input) {
    auto *region = dynamic_cast<TargetRegion *>(input);
    if (!region) {
        NIXL_ERROR << "FERRY backend: unloadMD was given metadata this backend did not load";
        return NIXL_ERR_INVALID_PARAM;
    }
    delete region;
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                        const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                        nixlBackendReqH *&handle, const nixl_opt_b_args_t *opt_args) const {
    if (operation != NIXL_READ && operation != NIXL_WRITE) {
        NIXL_ERROR << "FERRY backend: prepXfer: operation " << int(operation) << " is neither NIXL_READ nor NIXL_WRITE";
        return NIXL_ERR_INVALID_PARAM;
    }
    for (auto type : {local.getType(), remote.getType()}) {
        if (type != DRAM_SEG && type != VRAM_SEG) {
            NIXL_ERROR << "FERRY backend: prepXfer: memory type " << nixl_memory_name(type)
                       << " is not supported (DRAM_SEG and VRAM_SEG are)";
            return NIXL_ERR_NOT_SUPPORTED;
        }
    }
    if (local.descCount() != remote.descCount()) {
        NIXL_ERROR << "FERRY backend: prepXfer: " << local.descCount() << " local descriptors against "
                   << remote.descCount() << " remote ones; they must pair up";
        return NIXL_ERR_INVALID_PARAM;
    }
    auto xfer = std::make_unique<FerryTransfer>();
    if (!apply_custom_param(opt_args, *xfer)) return NIXL_ERR_INVALID_PARAM;
    xfer->remote_agent = remote_agent;
    xfer->requests.reserve(local.descCount());
    for (int i = 0; i < local.descCount(); ++i) {
        const auto &l = local[i];
        const auto &r = remote[i];
        if (l.len != r.len) {
            NIXL_ERROR << "FERRY backend: prepXfer: descriptor " << i << " is " << l.len << " bytes locally and "
                       << r.len << " bytes remotely; lengths must match";
            return NIXL_ERR_INVALID_PARAM;
        }
        auto *target = dynamic_cast<const TargetRegion *>(r.metadataP);
        if (!target) {
            NIXL_ERROR << "FERRY backend: prepXfer: remote descriptor " << i << " has no FERRY metadata; load agent '"
                       << remote_agent << "' metadata first";
            return NIXL_ERR_INVALID_PARAM;
        }
        if (l.len == 0) continue;  // nothing to move; Ferry refuses empty requests
        ferry_request_t req{};
        req.opcode = operation == NIXL_READ ? FERRY_READ : FERRY_WRITE;
        req.local_addr = reinterpret_cast<void *>(l.addr);
        req.segment = target->segment;
        req.remote_addr = r.addr;
        req.length = l.len;
        // Ferry picks by its protocol priority unless customParam forced one (xfer owns the text).
        req.transport = xfer->forced_transport.empty() ? nullptr : xfer->forced_transport.c_str();
        xfer->requests.push_back(req);
        xfer->bytes += l.len;
    }
    handle = xfer.release();
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                        const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                        nixlBackendReqH *&handle, const nixl_opt_b_args_t *opt_args) const {
    auto *xfer = dynamic_cast<FerryTransfer *>(handle);
    if (!xfer) {
        NIXL_ERROR << "FERRY backend: postXfer was given a handle this backend did not prepare";
        return NIXL_ERR_INVALID_PARAM;
    }
    if (xfer->state == FerryTransfer::State::Posted) {
        if (nixl_status_t st = checkXfer(xfer); st == NIXL_IN_PROG) {
            NIXL_ERROR << "FERRY backend: postXfer: the request is still in progress; wait for it before reposting";
            return NIXL_ERR_REPOST_ACTIVE;
        }
    }
    if (xfer->has_batch) {
        if (int rc = ferry_free_batch(engine_.get(), xfer->batch); rc != 0) {
            NIXL_ERROR << "FERRY backend: postXfer: releasing the previous batch failed: " << last_error();
            return to_nixl(rc);
        }
        xfer->has_batch = false;
    }
    xfer->notify = opt_args && opt_args->hasNotif;
    xfer->notif_message = xfer->notify ? opt_args->notifMsg : std::string();
    xfer->next_unfinished = 0;
    xfer->failure = NIXL_SUCCESS;
    (void)operation, (void)local, (void)remote, (void)remote_agent;

    if (xfer->requests.empty()) {  // only empty descriptors: done at once
        xfer->state = FerryTransfer::State::Posted;
        return finish(*xfer);
    }
    ferry_batch_id_t batch = 0;
    if (int rc = ferry_submit(engine_.get(), xfer->requests.data(), xfer->requests.size(), &batch); rc != 0) {
        NIXL_ERROR << "FERRY backend: submitting " << xfer->requests.size() << " requests to agent '"
                   << xfer->remote_agent << "' failed: " << last_error();
        xfer->state = FerryTransfer::State::Failed;
        xfer->failure = to_nixl(rc);
        return xfer->failure;
    }
    xfer->batch = batch;
    xfer->has_batch = true;
    xfer->state = FerryTransfer::State::Posted;
    xfer->posted_at = std::chrono::steady_clock::now();
    return NIXL_IN_PROG;
}

nixl_status_t nixlFerryEngine::checkXfer(nixlBackendReqH *handle) const {
    auto *xfer = dynamic_cast<FerryTransfer *>(handle);
    if (!xfer) {
        NIXL_ERROR << "FERRY backend: checkXfer was given a handle this backend did not prepare";
        return NIXL_ERR_INVALID_PARAM;
    }
    switch (xfer->state) {
        case FerryTransfer::State::Prepared: return NIXL_ERR_NOT_POSTED;
        case FerryTransfer::State::Done: return NIXL_SUCCESS;
        case FerryTransfer::State::Failed: return xfer->failure;
        case FerryTransfer::State::Posted: break;
    }
    // Ops finish in any order; scanning from the first unfinished one keeps repeated checks cheap.
    while (xfer->next_unfinished < xfer->requests.size()) {
        ferry_op_status_t status;
        size_t index = xfer->next_unfinished;
        if (int rc = ferry_get_status(engine_.get(), xfer->batch, index, &status); rc != 0) {
            NIXL_ERROR << "FERRY backend: reading the status of op " << index << " failed: " << last_error();
            xfer->state = FerryTransfer::State::Failed;
            xfer->failure = to_nixl(rc);
            return xfer->failure;
        }
        if (status.state == FERRY_OP_PENDING) return NIXL_IN_PROG;
        if (status.state == FERRY_OP_FAILED) {
            status.message[sizeof status.message - 1] = '\0';
            status.transport[sizeof status.transport - 1] = '\0';
            NIXL_ERROR << "FERRY backend: transfer to agent '" << xfer->remote_agent << "': op " << index << " of "
                       << xfer->requests.size() << " (" << xfer->requests[index].length << " bytes over "
                       << status.transport << ") failed: " << status.message;
            xfer->state = FerryTransfer::State::Failed;
            xfer->failure = to_nixl(status.error);
            return xfer->failure;
        }
        status.transport[sizeof status.transport - 1] = '\0';
        xfer->transport = status.transport;
        ++xfer->next_unfinished;
    }
    record_throughput(*xfer);
    return finish(*xfer);
}

// Every op is done: the notification goes out only now, so the peer sees the data first.
nixl_status_t nixlFerryEngine::finish(FerryTransfer &xfer) const {
    if (xfer.notify) {
        if (nixl_status_t st = send_notification(xfer.remote_agent, xfer.notif_message); st != NIXL_SUCCESS) {
            xfer.state = FerryTransfer::State::Failed;
            xfer.failure = st;
            return st;
        }
        xfer.notify = false;
    }
    if (xfer.has_batch && ferry_free_batch(engine_.get(), xfer.batch) == 0) xfer.has_batch = false;
    xfer.state = FerryTransfer::State::Done;
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::releaseReqH(nixlBackendReqH *handle) const {
    auto *xfer = dynamic_cast<FerryTransfer *>(handle);
    if (!xfer) {
        NIXL_ERROR << "FERRY backend: releaseReqH was given a handle this backend did not prepare";
        return NIXL_ERR_INVALID_PARAM;
    }
    if (xfer->has_batch) {
        // Ferry cannot take back bytes on the wire: wait for the ops so that no transfer
        // touches the caller's memory after it was told the request is gone.
        // (A failed op's own error is no reason to keep the batch; -EBUSY from free says it is busy.)
        (void)ferry_wait_batch(engine_.get(), xfer->batch, params_.release_timeout_ms);
        if (int f = ferry_free_batch(engine_.get(), xfer->batch); f == -EBUSY) {
            NIXL_ERROR << "FERRY backend: releaseReqH: the transfer to agent '" << xfer->remote_agent
                       << "' is still in flight after " << params_.release_timeout_ms
                       << " ms and cannot be aborted; release it again later (release_timeout_ms sets the wait)";
            return NIXL_ERR_REPOST_ACTIVE;
        } else if (f != 0) {
            NIXL_ERROR << "FERRY backend: releaseReqH: freeing the batch failed: " << last_error();
            return to_nixl(f);
        }
    }
    delete xfer;
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::send_notification(const std::string &remote_agent, const std::string &msg) const {
    if (remote_agent == localAgent) {
        std::lock_guard lock(mutex_);
        self_notifications_.emplace_back(localAgent, msg);
        return NIXL_SUCCESS;
    }
    ferry_segment_id_t segment = 0;
    if (!agent_segment(remote_agent, segment)) {
        NIXL_ERROR << "FERRY backend: no connection info for agent '" << remote_agent
                   << "'; load its metadata before notifying it";
        return NIXL_ERR_NOT_FOUND;
    }
    std::string payload = encode_notification(localAgent, msg);
    if (int rc = ferry_send_notification(engine_.get(), segment, payload.data(), payload.size()); rc != 0) {
        NIXL_ERROR << "FERRY backend: notifying agent '" << remote_agent << "' failed: " << last_error();
        return to_nixl(rc);
    }
    return NIXL_SUCCESS;
}

nixl_status_t nixlFerryEngine::genNotif(const std::string &remote_agent, const std::string &msg) const {
    return send_notification(remote_agent, msg);
}

nixl_status_t nixlFerryEngine::getNotifs(notif_list_t &notif_list) {
    {
        std::lock_guard lock(mutex_);
        while (!self_notifications_.empty()) {
            notif_list.push_back(std::move(self_notifications_.front()));
            self_notifications_.pop_front();
        }
    }
    ferry_notification_t *received = nullptr;
    size_t count = 0;
    if (int rc = ferry_take_notifications(engine_.get(), &received, &count); rc != 0) {
        NIXL_ERROR << "FERRY backend: taking notifications failed: " << last_error();
        return to_nixl(rc);
    }
    for (size_t i = 0; i < count; ++i) {
        std::string_view bytes(reinterpret_cast<const char *>(received[i].data), received[i].length);
        auto decoded = decode_notification(bytes);
        if (!decoded) {
            // Another Ferry user (not a NIXL agent) sent it: there is no agent to report it under.
            NIXL_WARN << "FERRY backend: dropped a " << received[i].length << "-byte notification from Ferry segment "
                      << received[i].from << " that no FERRY backend sent";
            continue;
        }
        notif_list.emplace_back(std::move(decoded->agent), std::move(decoded->message));
    }
    ferry_free_notifications(received, count);
    return NIXL_SUCCESS;
}

}  // namespace ferry_nixl
