// Managed buffers, the serving side: registering the host's memfd (register_mem_fd), marking
// the region in its descriptor (export_mem), and answering map channels (map_wire.hpp) with the
// memfd over SCM_RIGHTS, to authenticated initiators and for regions they may access only.
#include "transport.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_shm {

int Transport::register_mem_fd(const ferry_mem_region_t *r, int fd, uint64_t fd_offset, uint64_t *handle,
                               ferry_error_t *err) {
    SharedBacking b;
    std::string why;
    if (r->kind != FERRY_MEM_HOST || !b.init(fd, fd_offset, r->length, &why)) {
        if (r->kind == FERRY_MEM_HOST)
            log_.log(FERRY_LOG_WARN,
                     "managed region [0x%" PRIx64 ", +%" PRIu64 ") is served with cross-memory attach: its memfd %s",
                     r->addr, r->length, why.c_str());
        return register_mem(r, handle, err);
    }
    return register_mem(r, handle, err, &b);
}

int Transport::export_mem(uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
    auto r = regions_.find(handle);
    if (!r || !r->shared.valid()) {
        *len = 0;
        return 0;
    }
    SharedDesc d{kSharedDescMagic, kWireVersion, 0};
    if (*len < sizeof d) {
        *len = sizeof d;
        return set_error(err, -ENOSPC, "shm: a managed region's descriptor needs %zu bytes", sizeof d);
    }
    memcpy(buf, &d, sizeof d);
    *len = sizeof d;
    return 0;
}

namespace {

// One reply, with `fd` (>= 0) as its only ancillary data. False when the socket did not take it
// whole at once (an initiator that does not read its replies loses the channel).
bool send_reply(int sock, const MapReply &rep, int fd) {
    return send_with_fd(sock, &rep, sizeof rep, fd, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof rep);
}

}  // namespace

// Requests of an authenticated map channel (on_hello let it in). Each gets a reply; only a
// region registered with a memfd, and granting what is asked, ever gets its descriptor.
bool Transport::serve_map_requests(ServerConn &c, size_t *at) {
    while (c.rx.size() - *at >= sizeof(MapRequest)) {
        MapRequest m{};
        MapReply rep{};
        rep.magic = kMapReplyMagic;
        std::string why;
        const bool ok = parse_map_request(c.rx.data() + *at, sizeof m, &m, &why);
        *at += sizeof m;
        auto refuse = [&](int code, const std::string &what) {
            rep.status = code;
            snprintf(rep.message, sizeof rep.message, "shm: pid %d: %s", pid_, what.c_str());
            refused_log_.event(strprintf("refused pid %d a managed buffer's memfd: %s", c.pid, what.c_str()));
        };
        std::shared_ptr<Region> region;
        if (!ok) refuse(-EPROTO, why);
        else if (!(region = regions_.find_shared(m.addr, m.length)))
            refuse(-ENOENT,
                   strprintf("[0x%" PRIx64 ", +%" PRIu64 ") is not inside a managed buffer (ferry_alloc_shared)",
                             m.addr, m.length));
        else if ((region->access & m.access) != m.access)
            refuse(-EACCES, strprintf("the managed buffer at 0x%" PRIx64 " is not registered for remote %s",
                                      region->addr, m.access & FERRY_ACCESS_REMOTE_WRITE ? "read and write" : "read"));
        int fd = -1, opened = -1;
        if (rep.status == 0) {
            const SharedBacking &b = region->shared;
            fd = m.access & FERRY_ACCESS_REMOTE_WRITE ? b.fd() : (opened = b.reopen_read_only());
            if (fd < 0) refuse(-errno, "cannot open its memfd read-only: " + errno_string(errno));
            rep.base = region->addr;
            rep.length = region->length;
            rep.fd_offset = b.fd_offset;
            rep.live_offset = b.live_offset;
            rep.live_value = b.live_value;
            rep.ino = b.ino;
            rep.access = m.access;
        }
        bool sent;
        {
            std::lock_guard lock(c.out_mu);
            // Replies go out whole, never behind buffered bytes (the descriptor rides on them).
            sent = c.fd >= 0 && c.out.empty() && send_reply(c.fd, rep, rep.status == 0 ? fd : -1);
        }
        if (opened >= 0) close(opened);
        if (sent && rep.status == 0)
            log_.log(FERRY_LOG_DEBUG, "handed pid %d the memfd of managed buffer [0x%" PRIx64 ", +%" PRIu64 ") (%s)",
                     c.pid, region->addr, region->length,
                     m.access & FERRY_ACCESS_REMOTE_WRITE ? "read-write" : "read-only");
        if (!sent || !ok) return false;
    }
    return true;
}

}  // namespace ferry_shm
