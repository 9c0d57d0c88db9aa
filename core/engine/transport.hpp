// RAII handle over one plugin transport instance: turns the C ABI's codes and message
// buffers into Result values prefixed with the transport's name.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/plugin.h"
#include "ferry/result.hpp"
#include "loader/plugin_loader.hpp"

namespace ferry {

class StagingService;

using PluginOptions = std::vector<std::pair<std::string, std::string>>;

class Transport {
public:
    // `staging`: offered to plugins with FERRY_CAP_STAGED_DEVICE (ABI 1.1 stage_* calls) when
    // it has a GPU runtime; it must outlive the transport.
    static Result<std::unique_ptr<Transport>> create(std::shared_ptr<LoadedPlugin> plugin, const PluginOptions &options,
                                                     StagingService *staging = nullptr);
    ~Transport();
    Transport(const Transport &) = delete;
    Transport &operator=(const Transport &) = delete;

    const std::string &name() const { return plugin_->name; }
    const std::string &path() const { return plugin_->path; }
    const char *version() const { return plugin_->api->version; }
    uint64_t caps() const { return plugin_->api->caps; }
    bool moves(uint32_t memory_kind) const;
    // Serves device memory through the host's staging calls (it was offered them).
    bool serves_staged() const { return staged_; }
    bool reaches(bool same_host) const;
    // ABI 1.4: moves bytes between local memory and files (storage segments only).
    bool storage() const { return caps() & FERRY_CAP_STORAGE; }

    Result<std::vector<uint8_t>> endpoint();
    Result<uint64_t> register_mem(const ferry_mem_region_t &region);
    // ABI 1.3: the region is a mapping of memfd `fd` (ferry_alloc_shared); a plugin without
    // register_mem_fd gets plain register_mem.
    Result<uint64_t> register_mem_fd(const ferry_mem_region_t &region, int fd, uint64_t fd_offset);
    Result<void> deregister_mem(uint64_t handle);
    Result<std::vector<uint8_t>> export_mem(uint64_t handle);
    Result<uint64_t> connect(std::span<const uint8_t> endpoint);
    Result<void> disconnect(uint64_t peer);
    Result<uint64_t> import_mem(uint64_t peer, const ferry_mem_region_t &region, std::span<const uint8_t> key);
    Result<void> release_mem(uint64_t peer, uint64_t remote_mem);
    Result<void> submit(uint64_t peer, std::span<const ferry_xfer_op_t> ops);
    Result<size_t> poll(std::span<ferry_completion_t> out);
    // ABI 1.5: block lists (KV pages named once, moved by index with one completion).
    bool has_block_lists() const;
    Result<uint64_t> create_block_list(uint32_t side, uint64_t peer, std::span<const ferry_block_t> blocks);
    Result<void> destroy_block_list(uint64_t list);
    Result<void> submit_blocks(uint64_t peer, uint32_t opcode, uint64_t local_list, const uint32_t *local_index,
                               uint64_t remote_list, const uint32_t *remote_index, size_t n, uint64_t user_data);
    // ABI 1.6: copies within this process in as few launches as the plugin can, one completion
    // with `user_data` for all (GPU staging's gather and scatter).
    bool has_copy_local() const;
    Result<void> copy_local(int device, std::span<const ferry_local_copy_t> copies, uint64_t user_data);
    int completion_fd() const { return completion_fd_; }
    // ABI 1.5: the plugin's per-rail counters; empty when it has no rail_stats.
    Result<std::vector<ferry_rail_stats_t>> rail_stats();

private:
    Transport(std::shared_ptr<LoadedPlugin> plugin, ferry_transport_t *instance);
    Error error(int code, const ferry_error_t &err, const char *call) const;
    template <class Fn>
    Result<std::vector<uint8_t>> export_bytes(Fn &&fn, const char *call);

    std::shared_ptr<LoadedPlugin> plugin_;
    std::unique_ptr<ferry_host_api_t> host_;
    ferry_transport_t *instance_ = nullptr;
    int completion_fd_ = -1;
    bool staged_ = false;
};

}  // namespace ferry
