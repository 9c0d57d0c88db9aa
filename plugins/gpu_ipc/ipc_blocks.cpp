// Block lists on the GPU IPC transport: KV-cache pages checked once (region, bounds, device,
// rights) and kept as the addresses this process copies with, so a transfer of many of them
// by index costs an index check and a table row per pair, and one completion for all.
#include <algorithm>
#include <cerrno>

#include "ipc_transport.hpp"
#include "ipc_util.hpp"

namespace ferry_gpu {

int IpcTransport::create_block_list(uint32_t side, uint64_t peer, const ferry_block_t *blocks, size_t n, uint64_t *list,
                                    ferry_error_t *err) {
    if (n > UINT32_MAX) return fail(err, -E2BIG, "a block list holds at most 2^32 - 1 blocks");
    BlockList bl;
    bl.side = side;
    bl.peer = peer;
    bl.access = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
    bl.addr.resize(n);
    bl.length.resize(n);
    std::lock_guard lock(mu_);
    if (side == FERRY_BLOCKS_REMOTE && !peers_.count(peer))
        return fail(err, -ENOENT, "unknown peer " + std::to_string(peer));
    for (size_t i = 0; i < n; ++i) {
        const ferry_block_t &b = blocks[i];
        const ferry_mem_region_t *r = nullptr;
        int device = -1;
        uint64_t addr = b.addr;
        if (side == FERRY_BLOCKS_LOCAL) {
            auto it = regions_.find(b.mem);
            if (it == regions_.end())
                return fail(err, -EINVAL, "block " + std::to_string(i) + ": unknown local memory handle");
            r = &it->second.region;
            device = r->device_id;
        } else {
            auto it = imports_.find(b.mem);
            if (it == imports_.end() || it->second.peer != peer)
                return fail(err, -EINVAL, "block " + std::to_string(i) + ": unknown remote memory handle of this peer");
            r = &it->second.region;
            device = it->second.device;
            bl.access &= r->access;
        }
        if (b.length == 0 || b.addr < r->addr || b.length > r->length || b.addr - r->addr > r->length - b.length)
            return fail(err, -EFAULT,
                        "block " + std::to_string(i) + " [" + hex(b.addr) + ", +" + std::to_string(b.length) +
                            ") is not inside its registered region");
        if (side == FERRY_BLOCKS_REMOTE) {
            const Import &im = imports_.at(b.mem);
            addr = reinterpret_cast<uint64_t>(im.alloc_mapped) + (b.addr - im.alloc_base);
        }
        if (i == 0) bl.device = device;
        else if (device != bl.device)
            return fail(err, -EINVAL,
                        "block " + std::to_string(i) + " is on device " + std::to_string(device) + ", block 0 on " +
                            std::to_string(bl.device) + ": a block list names memory of one GPU; make one per GPU");
        bl.addr[i] = addr;
        bl.length[i] = b.length;
        bl.max_length = std::max(bl.max_length, b.length);
        bl.mems.push_back(b.mem);
    }
    std::sort(bl.mems.begin(), bl.mems.end());
    bl.mems.erase(std::unique(bl.mems.begin(), bl.mems.end()), bl.mems.end());
    uint64_t h = next_handle_++;
    block_lists_.emplace(h, std::move(bl));
    *list = h;
    return 0;
}

int IpcTransport::destroy_block_list(uint64_t list, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    if (!block_lists_.erase(list)) return fail(err, -ENOENT, "no block list with handle " + std::to_string(list));
    return 0;  // transfers submitted from it copy resolved addresses: they need nothing of it
}

void IpcTransport::stale_block_lists(uint64_t mem) {
    for (auto &[h, bl] : block_lists_)
        if (std::binary_search(bl.mems.begin(), bl.mems.end(), mem)) bl.stale = true;
}

int IpcTransport::submit_blocks(uint64_t peer, uint32_t opcode, uint64_t local_list, const uint32_t *local_index,
                                uint64_t remote_list, const uint32_t *remote_index, size_t n, uint64_t user_data,
                                ferry_error_t *err) {
    std::lock_guard lock(mu_);
    if (!peers_.count(peer)) return fail(err, -ENOENT, "unknown peer " + std::to_string(peer));
    auto li = block_lists_.find(local_list), ri = block_lists_.find(remote_list);
    if (li == block_lists_.end() || li->second.side != FERRY_BLOCKS_LOCAL)
        return fail(err, -EINVAL, "no local block list with handle " + std::to_string(local_list));
    if (ri == block_lists_.end() || ri->second.side != FERRY_BLOCKS_REMOTE || ri->second.peer != peer)
        return fail(err, -EINVAL, "no remote block list of this peer with handle " + std::to_string(remote_list));
    const BlockList &l = li->second, &r = ri->second;
    if (l.stale || r.stale)
        return fail(err, -ESTALE,
                    std::string("the ") + (l.stale ? "local" : "remote") +
                        " block list names memory that was deregistered or released since; make the list again");
    const bool read = opcode == FERRY_OP_READ;
    if (!(r.access & (read ? FERRY_ACCESS_REMOTE_READ : FERRY_ACCESS_REMOTE_WRITE)))
        return fail(err, -EACCES, "the peer did not grant that access to every block of the remote list");
    if (r.device >= 0 && r.device != l.device) {
        auto pa = peer_access_.find({l.device, r.device});
        if (pa == peer_access_.end()) {
            std::string e;
            DeviceGuard guard(*rt_);
            int rc = rt_->enable_peer_access(l.device, r.device, e);
            if (rc) log_.log(FERRY_LOG_WARN, "%s", e.c_str());
            pa = peer_access_.emplace(std::make_pair(l.device, r.device), rc).first;
        }
        if (pa->second != 0)
            return fail(
                err, pa->second,
                "device " + std::to_string(l.device) + " has no peer access to device " + std::to_string(r.device));
    }
    const size_t nl = l.addr.size(), nr = r.addr.size();
    auto bad_pair = [&](size_t i) {
        const uint32_t a = local_index[i], b = remote_index[i];
        if (a >= nl || b >= nr)
            return fail(err, -EINVAL,
                        "pair " + std::to_string(i) + ": block index " + std::to_string(a >= nl ? a : b) +
                            " is past the end of the " + (a >= nl ? "local" : "remote") + " list of " +
                            std::to_string(a >= nl ? nl : nr) + " blocks");
        return fail(err, -EINVAL,
                    "pair " + std::to_string(i) + ": local block " + std::to_string(a) + " has " +
                        std::to_string(l.length[a]) + " bytes, remote block " + std::to_string(b) + " " +
                        std::to_string(r.length[b]) + "; a pair moves blocks of one length");
    };
    // Every block small and the launch able to carry its table (KV pages): each pair becomes its
    // launch entry in one pass, with no plan between.
    if (n >= 2 && kernel_.max_op_bytes && l.max_length <= kernel_.max_op_bytes && kernel_ready(l.device) &&
        kernel_inline_[l.device]) {
        inline_begin(n);
        for (size_t i = 0; i < n; ++i) {
            const uint32_t a = local_index[i], b = remote_index[i];
            if (a >= nl || b >= nr || l.length[a] != r.length[b]) return bad_pair(i);
            const uint64_t local = l.addr[a], remote = r.addr[b];
            inline_launches_[i / kInlineTableOps].add(read ? remote : local, read ? local : remote, l.length[a]);
        }
        return queue_inline_group(n, l.device, user_data, err);
    }
    std::vector<Planned> plan(n);
    for (size_t i = 0; i < n; ++i) {
        const uint32_t a = local_index[i], b = remote_index[i];
        if (a >= nl || b >= nr || l.length[a] != r.length[b]) return bad_pair(i);
        auto *local = reinterpret_cast<void *>(l.addr[a]);
        auto *remote = reinterpret_cast<void *>(r.addr[b]);
        plan[i] = {read ? local : remote, read ? remote : local, l.length[a], l.device, 0};
    }
    return queue_group(plan, user_data, err);
}

}  // namespace ferry_gpu
