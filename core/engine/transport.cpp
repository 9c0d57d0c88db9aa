#include "engine/transport.hpp"

#include <cerrno>
#include <cstring>

#include "staging/stage_service.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

void host_log(void *, int level, const char *plugin, const char *message) {
    if (level < 0) level = 0;
    if (level > 4) level = 4;
    log::write(static_cast<log::Level>(level), plugin ? plugin : "plugin", message ? message : "");
}

}  // namespace

Result<std::unique_ptr<Transport>> Transport::create(std::shared_ptr<LoadedPlugin> plugin, const PluginOptions &options,
                                                     StagingService *staging) {
    auto host = std::make_unique<ferry_host_api_t>();
    host->struct_size = sizeof(ferry_host_api_t);
    host->log = host_log;
    host->log_level = static_cast<int>(log::level());
    if (staging && (plugin->api->caps & FERRY_CAP_STAGED_DEVICE) && (plugin->api->caps & FERRY_CAP_MEM_HOST))
        staging->fill_host_api(*host);
    std::vector<ferry_kv_t> kv;
    for (const auto &[k, v] : options) kv.push_back({k.c_str(), v.c_str()});
    ferry_error_t err{};
    ferry_transport_t *instance = nullptr;
    int rc = plugin->api->create(kv.data(), kv.size(), host.get(), &instance, &err);
    if (rc != 0 || !instance) {
        err.message[sizeof err.message - 1] = '\0';
        return fail(rc ? rc : -EFAULT, cat(plugin->name, ": create failed: ", err.message));
    }
    std::unique_ptr<Transport> t(new Transport(plugin, instance));
    t->staged_ = host->stage_copy != nullptr;
    t->host_ = std::move(host);
    if (plugin->api->completion_fd) {
        int fd = -1;
        if (plugin->api->completion_fd(instance, &fd, &err) == 0) t->completion_fd_ = fd;
    }
    return t;
}

Transport::Transport(std::shared_ptr<LoadedPlugin> plugin, ferry_transport_t *instance)
    : plugin_(std::move(plugin)), instance_(instance) {}

Transport::~Transport() {
    if (instance_) plugin_->api->destroy(instance_);
}

bool Transport::moves(uint32_t kind) const {
    switch (kind) {
        case FERRY_MEM_HOST: return caps() & FERRY_CAP_MEM_HOST;
        case FERRY_MEM_CUDA: return caps() & FERRY_CAP_MEM_CUDA;
        case FERRY_MEM_ROCM: return caps() & FERRY_CAP_MEM_ROCM;
    }
    return false;
}

bool Transport::reaches(bool same_host) const {
    return caps() & (same_host ? FERRY_CAP_INTRA_NODE : FERRY_CAP_INTER_NODE);
}

Error Transport::error(int code, const ferry_error_t &err, const char *call) const {
    std::string message(err.message, strnlen(err.message, sizeof err.message));
    if (message.empty()) message = cat(call, " failed: ", strerror(code < 0 ? -code : code));
    return Error{code < 0 ? code : -EIO, cat(name(), ": ", message)};
}

template <class Fn>
Result<std::vector<uint8_t>> Transport::export_bytes(Fn &&fn, const char *call) {
    std::vector<uint8_t> buf(256);
    for (int attempt = 0; attempt < 2; ++attempt) {
        size_t len = buf.size();
        ferry_error_t err{};
        int rc = fn(buf.data(), &len, &err);
        if (rc == 0) {
            buf.resize(len);
            return buf;
        }
        if (rc != -ENOSPC || len <= buf.size()) return std::unexpected(error(rc, err, call));
        buf.resize(len);
    }
    return fail(-ENOSPC, cat(name(), ": ", call, " kept asking for a larger buffer"));
}

Result<std::vector<uint8_t>> Transport::endpoint() {
    return export_bytes(
        [&](void *b, size_t *l, ferry_error_t *e) { return plugin_->api->export_endpoint(instance_, b, l, e); },
        "export_endpoint");
}

Result<uint64_t> Transport::register_mem(const ferry_mem_region_t &region) {
    ferry_error_t err{};
    uint64_t handle = 0;
    if (int rc = plugin_->api->register_mem(instance_, &region, &handle, &err))
        return std::unexpected(error(rc, err, "register_mem"));
    return handle;
}

Result<uint64_t> Transport::register_mem_fd(const ferry_mem_region_t &region, int fd, uint64_t fd_offset) {
    const ferry_plugin_v1_t *api = plugin_->api;
    if (api->struct_size < FERRY_PLUGIN_V1_SIZE_UNTIL(register_mem_fd) || api->register_mem_fd == nullptr)
        return register_mem(region);
    ferry_error_t err{};
    uint64_t handle = 0;
    if (int rc = api->register_mem_fd(instance_, &region, fd, fd_offset, &handle, &err))
        return std::unexpected(error(rc, err, "register_mem_fd"));
    return handle;
}

Result<void> Transport::deregister_mem(uint64_t handle) {
    ferry_error_t err{};
    if (int rc = plugin_->api->deregister_mem(instance_, handle, &err))
        return std::unexpected(error(rc, err, "deregister_mem"));
    return {};
}

Result<std::vector<uint8_t>> Transport::export_mem(uint64_t handle) {
    return export_bytes(
        [&](void *b, size_t *l, ferry_error_t *e) { return plugin_->api->export_mem(instance_, handle, b, l, e); },
        "export_mem");
}

Result<uint64_t> Transport::connect(std::span<const uint8_t> endpoint) {
    ferry_error_t err{};
    uint64_t peer = 0;
    if (int rc = plugin_->api->connect(instance_, endpoint.data(), endpoint.size(), &peer, &err))
        return std::unexpected(error(rc, err, "connect"));
    return peer;
}

Result<void> Transport::disconnect(uint64_t peer) {
    ferry_error_t err{};
    if (int rc = plugin_->api->disconnect(instance_, peer, &err)) return std::unexpected(error(rc, err, "disconnect"));
    return {};
}

Result<uint64_t> Transport::import_mem(uint64_t peer, const ferry_mem_region_t &region, std::span<const uint8_t> key) {
    ferry_error_t err{};
    uint64_t handle = 0;
    if (int rc = plugin_->api->import_mem(instance_, peer, &region, key.data(), key.size(), &handle, &err))
        return std::unexpected(error(rc, err, "import_mem"));
    return handle;
}

Result<void> Transport::release_mem(uint64_t peer, uint64_t remote_mem) {
    ferry_error_t err{};
    if (int rc = plugin_->api->release_mem(instance_, peer, remote_mem, &err))
        return std::unexpected(error(rc, err, "release_mem"));
    return {};
}

Result<void> Transport::submit(uint64_t peer, std::span<const ferry_xfer_op_t> ops) {
    ferry_error_t err{};
    if (int rc = plugin_->api->submit(instance_, peer, ops.data(), ops.size(), &err))
        return std::unexpected(error(rc, err, "submit"));
    return {};
}

Result<size_t> Transport::poll(std::span<ferry_completion_t> out) {
    ferry_error_t err{};
    int rc = plugin_->api->poll(instance_, out.data(), out.size(), &err);
    if (rc < 0) return std::unexpected(error(rc, err, "poll"));
    return static_cast<size_t>(rc);
}

bool Transport::has_block_lists() const {
    const ferry_plugin_v1_t *api = plugin_->api;
    return api->struct_size >= FERRY_PLUGIN_V1_SIZE_UNTIL(submit_blocks) && api->create_block_list &&
           api->destroy_block_list && api->submit_blocks;
}

Result<uint64_t> Transport::create_block_list(uint32_t side, uint64_t peer, std::span<const ferry_block_t> blocks) {
    ferry_error_t err{};
    uint64_t list = 0;
    if (int rc = plugin_->api->create_block_list(instance_, side, peer, blocks.data(), blocks.size(), &list, &err))
        return std::unexpected(error(rc, err, "create_block_list"));
    return list;
}

Result<void> Transport::destroy_block_list(uint64_t list) {
    ferry_error_t err{};
    if (int rc = plugin_->api->destroy_block_list(instance_, list, &err))
        return std::unexpected(error(rc, err, "destroy_block_list"));
    return {};
}

Result<void> Transport::submit_blocks(uint64_t peer, uint32_t opcode, uint64_t local_list, const uint32_t *local_index,
                                      uint64_t remote_list, const uint32_t *remote_index, size_t n,
                                      uint64_t user_data) {
    ferry_error_t err{};
    if (int rc = plugin_->api->submit_blocks(instance_, peer, opcode, local_list, local_index, remote_list,
                                             remote_index, n, user_data, &err))
        return std::unexpected(error(rc, err, "submit_blocks"));
    return {};
}

bool Transport::has_copy_local() const {
    const ferry_plugin_v1_t *api = plugin_->api;
    return api->struct_size >= FERRY_PLUGIN_V1_SIZE_UNTIL(copy_local) && api->copy_local;
}

Result<void> Transport::copy_local(int device, std::span<const ferry_local_copy_t> copies, uint64_t user_data) {
    ferry_error_t err{};
    if (int rc = plugin_->api->copy_local(instance_, device, copies.data(), copies.size(), user_data, &err))
        return std::unexpected(error(rc, err, "copy_local"));
    return {};
}

Result<std::vector<ferry_rail_stats_t>> Transport::rail_stats() {
    const ferry_plugin_v1_t *api = plugin_->api;
    std::vector<ferry_rail_stats_t> out;
    if (api->struct_size < FERRY_PLUGIN_V1_SIZE_UNTIL(rail_stats) || api->rail_stats == nullptr) return out;
    out.resize(8);  // tcp.so has at most 8 rails; rdma.so as many as NICs
    for (int attempt = 0; attempt < 2; ++attempt) {
        size_t n = out.size();
        ferry_error_t err{};
        int rc = api->rail_stats(instance_, out.data(), &n, &err);
        if (rc == 0 && n <= out.size()) {
            out.resize(n);
            for (auto &r : out) r.name[sizeof r.name - 1] = '\0';
            return out;
        }
        if (rc != -ENOSPC || n <= out.size()) return std::unexpected(error(rc ? rc : -EPROTO, err, "rail_stats"));
        out.resize(n);
    }
    return fail(-ENOSPC, cat(name(), ": rail_stats kept asking for a larger array"));
}

}  // namespace ferry
