// rdma.so's serving side: what other instances ask of this one over an authenticated control
// connection (ControlServer in control_server.cpp accepts, authenticates and reads them): queue
// pair handshakes (Connect, Reconnect) and registration queries (Query). The initiator's side is
// in transport.cpp.
#include <algorithm>
#include <cerrno>

#include "control.hpp"
#include "transport.hpp"

namespace ferry_rdma {

int Transport::serve_connect(Served &s, const ConnectBody &b, ConnectAckBody *ack, std::string *why) {
    s.token = b.token;
    s.nics = b.nics;
    for (const auto &p : b.pairs) {
        if (p.remote_nic >= nics_.size()) {
            *why = "the initiator names NIC " + std::to_string(p.remote_nic) + " here, this instance has " +
                   std::to_string(nics_.size());
            return -EINVAL;
        }
        // The responder side never posts: a minimal send queue.
        auto qp = QueuePair::create(*nics_[p.remote_nic], 2, why);
        if (!qp) return -ENOMEM;
        if (int rc = qp->connect(b.nics[p.local_nic], p.qpn, p.psn, cfg_, why); rc != 0) return rc;
        ack->pairs.push_back({p.remote_nic, p.local_nic, qp->qpn(), qp->psn()});
        s.qps[{p.remote_nic, p.local_nic}] = std::move(qp);  // replaces (and destroys) a failed one
    }
    return 0;
}

bool Transport::serve_request(ServedConn &c, const CtrlHeader &h, const std::vector<uint8_t> &body) {
    if (!c.session) c.session = std::make_unique<Served>();
    Served &s = static_cast<Served &>(*c.session);
    CtrlHeader reply;
    reply.req_id = h.req_id;
    std::vector<uint8_t> out;
    std::string why;
    int timeout = static_cast<int>(cfg_.control.reply_timeout_ms);
    int rc = 0;
    auto type = static_cast<CtrlType>(h.type);
    if (type == CtrlType::Connect || type == CtrlType::Reconnect) {
        reply.type = static_cast<uint16_t>(type == CtrlType::Connect ? CtrlType::ConnectAck : CtrlType::ReconnectAck);
        ConnectBody b;
        ConnectAckBody ack;
        if (!decode_connect(body.data(), body.size(), &b, &why)) rc = -EPROTO;
        else if (type == CtrlType::Reconnect && b.token != s.token)
            rc = -EPROTO, why = "reconnect from another instance than connected";
        else rc = serve_connect(s, b, &ack, &why);
        if (rc == 0) out = encode_connect_ack(ack);
    } else if (uint64_t addr = 0, len = 0; type == CtrlType::Query && decode_query(body, &addr, &len)) {
        reply.type = static_cast<uint16_t>(CtrlType::QueryReply);
        // Every registration overlapping the range: the initiator refuses the rest itself.
        std::lock_guard lock(mu_);
        MemDescriptor all;
        std::vector<const LocalRegion *> hits;
        for (auto &[hd, r] : regions_)
            if (len > 0 && r->addr < addr + len && addr < r->addr + r->length) hits.push_back(r.get());
        std::sort(hits.begin(), hits.end(), [](auto *x, auto *y) { return x->addr < y->addr; });
        for (const LocalRegion *r : hits) {
            MemDescriptor d = describe(*r);
            all.nearest_nics |= d.nearest_nics;
            for (auto &c : d.chunks) all.chunks.push_back(std::move(c));
        }
        out = encode_mem(all, nics_.size());
    } else {
        reply.type = h.type + 1;
        rc = -EPROTO;
        why = "unexpected control message type " + std::to_string(h.type);
    }
    if (rc != 0) {
        reply.status = rc;
        out.assign(why.begin(), why.end());
        log_.log(FERRY_LOG_INFO, "refused a control request: %s", why.c_str());
    }
    std::string send_why;
    if (send_msg(c.fd, reply, out, timeout, &send_why) != 0) {
        log_.log(FERRY_LOG_WARN, "control reply lost: %s", send_why.c_str());
        return false;
    }
    return true;
}

}  // namespace ferry_rdma
