// Block tables: KV-cache pages named once (checked against the registered memory on each side)
// and then moved by index. A transfer is checked pair by pair against the tables alone (an index
// and a length compare); where its path is a transport with block lists (plugin ABI 1.5: the GPU
// IPC transports) it goes to the plugin whole, as one op of the engine with one completion, so
// nothing in the engine grows with the number of pairs. Elsewhere, and until such a path is
// prepared (the first transfer between two tables routes its pairs as ordinary ops, which also
// connects), its pairs are submitted as ops.
#include <algorithm>
#include <cerrno>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {

namespace {
constexpr uint32_t kMixedKinds = UINT32_MAX;
}

struct BlockTable {
    BlockTableId id = 0;
    SegmentId segment = kLocalMemory;
    std::vector<uint64_t> addr, length;
    uint32_t kind = 0;  // every block's memory kind; kMixedKinds: several (never posted whole)

    std::mutex mutex;  // guards the lists below
    // The plugin's list of these blocks, by transport index (a remote table's: of `peer`).
    struct PluginList {
        uint64_t list = 0;
        uint64_t peer = 0;
    };
    std::map<size_t, PluginList> lists;
};

Result<BlockTableId> Engine::Impl::create_block_table(SegmentId segment, std::span<const uint64_t> addrs,
                                                      std::span<const uint64_t> lengths) {
    if (addrs.empty()) return fail(-EINVAL, "create_block_table: no blocks");
    if (addrs.size() > UINT32_MAX) return fail(-E2BIG, "create_block_table: at most 2^32 - 1 blocks per table");
    if (lengths.size() != 1 && lengths.size() != addrs.size())
        return fail(-EINVAL, cat("create_block_table: ", lengths.size(), " lengths for ", addrs.size(),
                                 " blocks; give one length per block, or one for all"));
    auto table = std::make_shared<BlockTable>();
    table->segment = segment;
    table->addr.assign(addrs.begin(), addrs.end());
    table->length.resize(addrs.size());
    for (size_t i = 0; i < addrs.size(); ++i) {
        table->length[i] = lengths.size() == 1 ? lengths[0] : lengths[i];
        if (table->length[i] == 0) return fail(-EINVAL, cat("create_block_table: block ", i, " has length 0"));
    }
    auto kind_of = [&](size_t i, uint32_t kind) {
        if (i == 0) table->kind = kind;
        else if (table->kind != kind) table->kind = kMixedKinds;
    };
    if (segment == kLocalMemory) {
        std::shared_lock lock(regions_mutex);
        for (size_t i = 0; i < addrs.size(); ++i) {
            const LocalRow *row = regions.find(addrs[i], table->length[i]);
            if (!row)
                return fail(-EFAULT, cat("create_block_table: local block ", i, " [", hex(addrs[i]), ", +",
                                         table->length[i], ") is not inside one registered region; register it first"));
            kind_of(i, row->kind);
        }
    } else {
        auto seg = this->segment(segment);
        if (!seg)
            return fail(-ENOENT,
                        cat("create_block_table: segment id ", segment, " is not open; call open_segment first"));
        // A block the cached descriptor does not hold may be in a region registered since.
        for (int pass = 0; pass < 2; ++pass) {
            size_t missing = addrs.size();
            {
                std::lock_guard lock(seg->mutex);
                if (seg->storage) return fail(-EINVAL, "create_block_table: file segments take ordinary ops");
                for (size_t i = 0; i < addrs.size() && missing == addrs.size(); ++i) {
                    const RegionDescriptor *r = seg->descriptor.find_region(addrs[i], table->length[i]);
                    if (r) kind_of(i, r->kind);
                    else missing = i;
                }
            }
            if (missing == addrs.size()) break;
            if (pass == 1)
                return fail(-EFAULT, cat("create_block_table: remote block ", missing, " [", hex(addrs[missing]), ", +",
                                         table->length[missing], ") is not inside one region that segment ", seg->name,
                                         " registered"));
            if (auto r = refresh_segment(*seg); !r) return std::unexpected(r.error());
        }
    }
    std::lock_guard lock(block_tables_mutex);
    table->id = next_block_table++;
    block_tables[table->id] = table;
    return table->id;
}

Result<void> Engine::Impl::destroy_block_table(BlockTableId id) {
    std::shared_ptr<BlockTable> table;
    {
        std::lock_guard lock(block_tables_mutex);
        auto it = block_tables.find(id);
        if (it == block_tables.end()) return fail(-ENOENT, cat("destroy_block_table: no block table ", id));
        table = std::move(it->second);
        block_tables.erase(it);
    }
    std::lock_guard lock(table->mutex);
    for (auto &[t, l] : table->lists) (void)transports[t]->destroy_block_list(l.list);
    table->lists.clear();
    return {};
}

bool Engine::Impl::prepare_block_path(BlockTable &local, BlockTable &remote, RemoteSegment &seg, size_t t) {
    auto &tr = *transports[t];
    // A transport that moves both sides' memory itself (no staging through host slices).
    if (!tr.has_block_lists() || local.kind == kMixedKinds || remote.kind == kMixedKinds || !tr.moves(local.kind) ||
        !tr.moves(remote.kind))
        return false;
    std::scoped_lock lists_lock(local.mutex, remote.mutex);
    std::vector<ferry_block_t> blocks;
    if (!local.lists.count(t)) {
        blocks.resize(local.addr.size());
        std::shared_lock lock(regions_mutex);
        for (size_t i = 0; i < blocks.size(); ++i) {
            const LocalRow *row = regions.find(local.addr[i], local.length[i]);
            auto h = row ? row->handle(t) : std::nullopt;
            if (!h) return false;  // unregistered since, or not with this transport
            blocks[i] = {local.addr[i], local.length[i], *h};
        }
        auto list = tr.create_block_list(FERRY_BLOCKS_LOCAL, 0, blocks);
        if (!list) {
            FERRY_WARN("block table ", local.id, ": ", list.error().message, "; its transfers go as ops");
            return false;
        }
        local.lists[t] = {*list, 0};
    }
    uint64_t peer = 0;
    // Every region the table names imported over t: what an op's route would import one by
    // one, done here at once (an import of these transports maps memory; it never waits on a
    // peer). Then the handles, under the segment's lock, as they are now.
    for (int pass = 0; pass < 2; ++pass) {
        std::vector<std::pair<ferry_mem_region_t, std::vector<uint8_t>>> to_import;
        {
            std::lock_guard lock(seg.mutex);
            if (seg.closed || t >= seg.peers.size() || !seg.peers[t]) return false;
            peer = *seg.peers[t];
            auto known = remote.lists.find(t);
            if (known != remote.lists.end() && known->second.peer == peer) return true;
            blocks.resize(remote.addr.size());
            const RegionDescriptor *last = nullptr;
            for (size_t i = 0; i < blocks.size(); ++i) {
                const RegionDescriptor *r = last && last->holds(remote.addr[i], remote.length[i])
                                                ? last
                                                : seg.descriptor.find_region(remote.addr[i], remote.length[i]);
                if (!r) return false;  // deregistered since: its pairs fail as ops, with the reason
                auto h = seg.imported.find({t, r->addr});
                if (h != seg.imported.end()) {
                    blocks[i] = {remote.addr[i], remote.length[i], h->second};
                } else if (r != last) {
                    const auto *key = r->key_for(tr.name());
                    if (!key) return false;
                    to_import.emplace_back(to_abi(*r), key->key);
                }
                last = r;
            }
            if (to_import.empty()) break;
        }
        if (pass == 1) return false;  // the descriptor moved under us twice: ops this time
        for (auto &[region, key] : to_import) {
            auto got = tr.import_mem(peer, region, key);
            if (!got) {
                FERRY_WARN("segment ", seg.name, ": ", got.error().message, "; block transfers go as ops");
                return false;
            }
            bool kept;
            {
                std::lock_guard lock(seg.mutex);
                kept = seg.adopt_import(t, region.addr, peer, *got);
            }
            if (!kept) (void)tr.release_mem(peer, *got);  // someone else's, or nobody may use it now
        }
    }
    // One path per remote table: the one its last transfer took.
    for (auto &[u, l] : remote.lists) (void)transports[u]->destroy_block_list(l.list);
    remote.lists.clear();
    auto list = tr.create_block_list(FERRY_BLOCKS_REMOTE, peer, blocks);
    if (!list) {
        FERRY_WARN("block table ", remote.id, ": ", list.error().message, "; its transfers go as ops");
        return false;
    }
    remote.lists[t] = {*list, peer};
    return true;
}

std::optional<Result<BatchId>> Engine::Impl::post_blocks(Opcode opcode, BlockTable &local,
                                                         std::span<const uint32_t> local_index, BlockTable &remote,
                                                         std::span<const uint32_t> remote_index, uint64_t bytes) {
    auto seg = segment(remote.segment);
    if (!seg) return std::nullopt;
    size_t t = 0;
    uint64_t peer = 0, llist = 0, rlist = 0;
    {
        std::scoped_lock lists_lock(local.mutex, remote.mutex);
        if (remote.lists.empty()) return std::nullopt;
        t = remote.lists.begin()->first;
        auto l = local.lists.find(t);
        if (l == local.lists.end()) return std::nullopt;
        std::lock_guard lock(seg->mutex);
        // A path that failed lately, or a descriptor that changed: ops, routed afresh.
        if (seg->closed || seg->stale.load(std::memory_order_relaxed) || !seg->paused.empty() ||
            !seg->unusable.empty() || !seg->peers[t] || *seg->peers[t] != remote.lists.begin()->second.peer)
            return std::nullopt;
        peer = *seg->peers[t];
        llist = l->second.list;
        rlist = remote.lists.begin()->second.list;
    }
    auto batch = std::make_shared<Batch>();
    batch->id = next_batch.fetch_add(1);
    batch->size = 1;
    batch->pairs = local_index.size();
    batch->submitted = std::chrono::steady_clock::now();
    batch->ops = std::make_unique<OpRecord[]>(1);
    batch->remaining.store(1, std::memory_order_relaxed);
    OpRecord &op = batch->ops[0];
    op.batch = batch.get();
    op.opcode = opcode;
    op.length = bytes;
    op.forced = true;  // the pairs have no other path as a whole: a failure is theirs
    op.local = reinterpret_cast<void *>(local.addr[local_index[0]]);
    op.remote = remote.addr[remote_index[0]];
    op.segment = remote.segment;
    op.transport.store(static_cast<uint16_t>(t), std::memory_order_relaxed);
    {
        std::lock_guard lock(batches_mutex);
        batches[batch->id] = batch;
    }
    auto r = transports[t]->submit_blocks(peer, opcode == Opcode::Read ? FERRY_OP_READ : FERRY_OP_WRITE, llist,
                                          local_index.data(), rlist, remote_index.data(), local_index.size(),
                                          reinterpret_cast<uintptr_t>(&op));
    if (r) return batch->id;
    {
        std::lock_guard lock(batches_mutex);
        batches.erase(batch->id);
    }
    if (r.error().code != -ESTALE) return std::unexpected(r.error());
    // Memory of a list was deregistered or released since: its lists go, and the pairs take
    // the ordinary route (which says what is missing, or prepares the path again).
    std::scoped_lock lists_lock(local.mutex, remote.mutex);
    for (auto *table : {&local, &remote})
        if (auto it = table->lists.find(t); it != table->lists.end()) {
            (void)transports[t]->destroy_block_list(it->second.list);
            table->lists.erase(it);
        }
    return std::nullopt;
}

Result<BatchId> Engine::Impl::submit_blocks(Opcode opcode, BlockTableId local_id, std::span<const uint32_t> local_index,
                                            BlockTableId remote_id, std::span<const uint32_t> remote_index) {
    if (local_index.size() != remote_index.size())
        return fail(-EINVAL, cat("submit_blocks: ", local_index.size(), " local indices but ", remote_index.size(),
                                 " remote ones; give one of each per pair"));
    if (local_index.empty()) return fail(-EINVAL, "submit_blocks: no pairs");
    std::shared_ptr<BlockTable> local, remote;
    {
        std::lock_guard lock(block_tables_mutex);
        if (auto it = block_tables.find(local_id); it != block_tables.end()) local = it->second;
        if (auto it = block_tables.find(remote_id); it != block_tables.end()) remote = it->second;
    }
    if (!local || local->segment != kLocalMemory)
        return fail(-EINVAL, cat("submit_blocks: ", local_id, " is not a block table of local memory"));
    if (!remote || remote->segment == kLocalMemory)
        return fail(-EINVAL, cat("submit_blocks: ", remote_id, " is not a block table of an open segment"));
    const size_t nl = local->addr.size(), nr = remote->addr.size();
    uint64_t bytes = 0;
    for (size_t i = 0; i < local_index.size(); ++i) {
        const uint32_t a = local_index[i], b = remote_index[i];
        if (a >= nl || b >= nr)
            return fail(-EINVAL, cat("submit_blocks: pair ", i, ": ", a >= nl ? "local" : "remote", " index ",
                                     a >= nl ? a : b, " is past the table's ", a >= nl ? nl : nr, " blocks"));
        if (local->length[a] != remote->length[b])
            return fail(-EINVAL,
                        cat("submit_blocks: pair ", i, ": local block ", a, " has ", local->length[a],
                            " bytes, remote block ", b, " ", remote->length[b], "; a pair moves equal blocks"));
        bytes += local->length[a];
    }
    if (auto whole = post_blocks(opcode, *local, local_index, *remote, remote_index, bytes)) return *whole;
    std::vector<Request> requests(local_index.size());
    for (size_t i = 0; i < requests.size(); ++i) {
        auto &rq = requests[i];
        rq.opcode = opcode;
        rq.local = reinterpret_cast<void *>(local->addr[local_index[i]]);
        rq.segment = remote->segment;
        rq.remote = remote->addr[remote_index[i]];
        rq.length = local->length[local_index[i]];
    }
    auto id = submit(requests);
    if (!id) return id;
    // The path its first pair took, prepared for the next transfers between these tables.
    auto batch = find_batch(*id);
    auto seg = segment(remote->segment);
    if (batch && seg) {
        auto t = batch->ops[0].transport.load(std::memory_order_relaxed);
        if (t != kNoTransport) prepare_block_path(*local, *remote, *seg, t);
    }
    return id;
}

Result<BlockTableId> Engine::create_block_table(SegmentId segment, std::span<const uint64_t> addrs,
                                                std::span<const uint64_t> lengths) {
    return impl_->create_block_table(segment, addrs, lengths);
}

Result<void> Engine::destroy_block_table(BlockTableId table) { return impl_->destroy_block_table(table); }

Result<BatchId> Engine::submit_blocks(Opcode opcode, BlockTableId local, std::span<const uint32_t> local_index,
                                      BlockTableId remote, std::span<const uint32_t> remote_index) {
    return impl_->submit_blocks(opcode, local, local_index, remote, remote_index);
}

}  // namespace ferry
