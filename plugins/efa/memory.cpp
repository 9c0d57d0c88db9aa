#include "memory.hpp"

#include "plugin_util.hpp"

#include <rdma/fi_errno.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>

namespace ferry_efa {

const MrChunk &LocalRegion::chunk_at(uint64_t a) const {
    auto it =
        std::upper_bound(chunks.begin(), chunks.end(), a, [](uint64_t x, const MrChunk &c) { return x < c.addr; });
    return *(it - 1);
}

void LocalRegion::retire_and_wait(const Logger &log) {
    pins_.retire_and_wait([&](uint64_t users) {
        log.log(FERRY_LOG_WARN,
                "deregister of [0x%" PRIx64 ", +%" PRIu64 ") waits for %" PRIu64 " op(s) the provider still holds",
                addr, length, users);
    });
}

KeySource::KeySource(size_t key_bytes) {
    mask_ = key_bytes >= 8 ? ~0ull : (1ull << (8 * key_bytes)) - 1;
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != static_cast<ssize_t>(sizeof r))
        r = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    // Random high half, so keys of an instance that restarted do not match old ones.
    next_ = key_bytes >= 8 ? (r & 0xffffffff00000000ull) | 1 : 1;
}

uint64_t KeySource::next() { return next_.fetch_add(1) & mask_; }

namespace {

bool split_worth_trying(int rc) {
    return rc == -FI_EINVAL || rc == -FI_ENOMEM || rc == -FI_E2BIG || rc == -FI_ENOSPC || rc == -FI_EMSGSIZE ||
           rc == -FI_EFAULT || rc == -FI_ETOOSMALL;
}

int register_chunk(Fabric &fab, KeySource &keys, const ferry_mem_region_t &r, uint64_t addr, uint64_t len,
                   MrChunk *out) {
    uint64_t access = FI_READ | FI_WRITE;
    if (r.access & FERRY_ACCESS_REMOTE_READ) access |= FI_REMOTE_READ;
    if (r.access & FERRY_ACCESS_REMOTE_WRITE) access |= FI_REMOTE_WRITE;
    iovec iov{reinterpret_cast<void *>(addr), len};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.offset = 0;
    attr.iface = FI_HMEM_SYSTEM;
    if (r.kind == FERRY_MEM_CUDA) {
        attr.iface = FI_HMEM_CUDA;
        attr.device.cuda = r.device_id;
    } else if (r.kind == FERRY_MEM_ROCM) {
        attr.iface = FI_HMEM_ROCR;
    }
    const bool prov_key = fab.mr_mode & FI_MR_PROV_KEY;
    int rc = 0;
    fid_mr *mr = nullptr;
    for (int attempt = 0; attempt < 8; ++attempt) {  // an application key may already be taken
        attr.requested_key = prov_key ? 0 : keys.next();
        auto lk = fab.lock();
        rc = fi_mr_regattr(fab.domain, &attr, 0, &mr);
        if (rc != -FI_ENOKEY || prov_key) break;
    }
    if (rc != 0) return rc;
    if (fab.mr_mode & FI_MR_ENDPOINT) {
        auto lk = fab.lock();
        if ((rc = fi_mr_bind(mr, &fab.ep->fid, 0)) == 0) rc = fi_mr_enable(mr);
        if (rc != 0) {
            fi_close(&mr->fid);
            return rc;
        }
    }
    out->addr = addr;
    out->len = len;
    out->mr = mr;
    out->desc = fi_mr_desc(mr);
    out->key = fi_mr_key(mr);
    out->rma_base = (fab.mr_mode & FI_MR_VIRT_ADDR) ? addr : 0;
    return 0;
}

}  // namespace

int register_region(Fabric &fab, uint64_t max_mr_size, KeySource &keys, const ferry_mem_region_t &r,
                    LocalRegion &region, std::string *why) {
    uint64_t limit = max_mr_size ? max_mr_size : r.length;
    uint64_t at = r.addr;
    const uint64_t end = r.addr + r.length;
    while (at < end) {
        uint64_t len = std::min(limit, end - at);
        MrChunk c;
        int rc = register_chunk(fab, keys, r, at, len, &c);
        if (rc != 0 && split_worth_trying(rc) && len > (1ull << 20) && max_mr_size == 0) {
            limit = std::max<uint64_t>(len / 2, 1ull << 20);  // the provider's limit, found by halving
            continue;
        }
        if (rc != 0) {
            *why = strprintf("fi_mr_regattr of [0x%" PRIx64 ", +%" PRIu64 ") failed: %s", at, len,
                             fi_error_string(rc).c_str());
            close_region(fab, region);
            return rc < 0 ? rc : -rc;
        }
        region.chunks.push_back(c);
        at += len;
    }
    return 0;
}

void close_region(Fabric &fab, LocalRegion &region) {
    auto lk = fab.lock();
    for (auto &c : region.chunks)
        if (c.mr) fi_close(&c.mr->fid);
    region.chunks.clear();
}

RemoteChunk to_remote(const LocalRegion &region, const MrChunk &c) {
    return RemoteChunk{c.addr, c.len, c.key, c.rma_base, region.access, 0};
}

std::vector<uint8_t> export_chunks(const LocalRegion &region) {
    MemHead h{kMemMagic, kWireVersion, region.staged ? kMemStaged : uint16_t{0},
              static_cast<uint32_t>(region.chunks.size()), 0};
    std::vector<uint8_t> out(sizeof h + region.chunks.size() * sizeof(RemoteChunk));
    memcpy(out.data(), &h, sizeof h);
    for (size_t i = 0; i < region.chunks.size(); ++i) {
        RemoteChunk rc = to_remote(region, region.chunks[i]);
        memcpy(out.data() + sizeof h + i * sizeof rc, &rc, sizeof rc);
    }
    return out;
}

bool parse_chunks(const void *bytes, size_t len, std::vector<RemoteChunk> *out, std::string *why, bool *staged) {
    MemHead h;
    if (len < sizeof h) {
        *why = strprintf("export_mem bytes are %zu bytes, too short for efa.so's header", len);
        return false;
    }
    memcpy(&h, bytes, sizeof h);
    if (h.magic != kMemMagic || h.version != kWireVersion) {
        *why = "export_mem bytes are not from efa.so (wrong magic or version)";
        return false;
    }
    if (staged != nullptr) *staged = (h.flags & kMemStaged) != 0;
    if ((len - sizeof h) / sizeof(RemoteChunk) != h.count || (len - sizeof h) % sizeof(RemoteChunk) != 0) {
        *why = strprintf("export_mem bytes announce %u registrations but hold %zu bytes", h.count, len);
        return false;
    }
    out->resize(h.count);
    if (h.count > 0)  // memcpy to an empty vector's null data() is undefined even for 0 bytes
        memcpy(out->data(), static_cast<const uint8_t *>(bytes) + sizeof h, h.count * sizeof(RemoteChunk));
    for (auto &c : *out) {
        c.revoked = 0;
        if (c.len == 0 || c.addr + c.len < c.addr) {
            *why = "export_mem bytes hold an empty or wrapping registration";
            return false;
        }
    }
    std::sort(out->begin(), out->end(), [](const RemoteChunk &a, const RemoteChunk &b) { return a.addr < b.addr; });
    return true;
}

}  // namespace ferry_efa
