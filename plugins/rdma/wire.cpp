#include "wire.hpp"

#include <arpa/inet.h>

#include <cstdio>

namespace ferry_rdma {

namespace {

class Writer {
public:
    void u8(uint8_t v) { b_.push_back(v); }
    void u16(uint16_t v) { put(v, 2); }
    void u32(uint32_t v) { put(v, 4); }
    void u64(uint64_t v) { put(v, 8); }
    void bytes(const void *p, size_t n) {
        auto *c = static_cast<const uint8_t *>(p);
        b_.insert(b_.end(), c, c + n);
    }
    std::vector<uint8_t> take() { return std::move(b_); }

private:
    void put(uint64_t v, int n) {
        for (int i = 0; i < n; ++i) b_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
    std::vector<uint8_t> b_;
};

// Reads fail once and stay failed; the first failure names the field.
class Reader {
public:
    Reader(const void *p, size_t n, std::string *why) : p_(static_cast<const uint8_t *>(p)), n_(n), why_(why) {}
    bool ok() const { return ok_; }
    size_t left() const { return n_ - off_; }
    uint8_t u8(const char *f) { return static_cast<uint8_t>(get(1, f)); }
    uint16_t u16(const char *f) { return static_cast<uint16_t>(get(2, f)); }
    uint32_t u32(const char *f) { return static_cast<uint32_t>(get(4, f)); }
    uint64_t u64(const char *f) { return get(8, f); }
    bool bytes(void *dst, size_t n, const char *f) {
        if (!need(n, f)) return false;
        memcpy(dst, p_ + off_, n);
        off_ += n;
        return true;
    }
    bool fail(const std::string &msg) {
        if (ok_ && why_ != nullptr) *why_ = msg;
        ok_ = false;
        return false;
    }
    bool expect_end(const char *what) {
        if (ok_ && off_ != n_) return fail(std::string(what) + ": " + std::to_string(n_ - off_) + " trailing bytes");
        return ok_;
    }

private:
    bool need(size_t n, const char *f) {
        if (!ok_) return false;
        if (n > n_ - off_) return fail(std::string("truncated at ") + f + " (" + std::to_string(n_) + " bytes)");
        return true;
    }
    uint64_t get(int n, const char *f) {
        if (!need(static_cast<size_t>(n), f)) return 0;
        uint64_t v = 0;
        for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p_[off_ + i]) << (8 * i);
        off_ += static_cast<size_t>(n);
        return v;
    }
    const uint8_t *p_;
    size_t n_, off_ = 0;
    std::string *why_;
    bool ok_ = true;
};

void put_nic(Writer &w, const NicAddress &n) {
    w.u8(static_cast<uint8_t>(n.name.size()));
    w.bytes(n.name.data(), n.name.size());
    w.u16(n.lid);
    w.u8(n.port);
    w.u8(static_cast<uint8_t>(n.link));
    w.u8(n.mtu);
    w.u8(n.gid_index);
    w.bytes(n.gid, 16);
}

bool get_nic(Reader &r, NicAddress *n) {
    uint8_t len = r.u8("NIC name length");
    if (r.ok() && (len == 0 || len > 63)) return r.fail("NIC name length " + std::to_string(len) + " (1..63)");
    n->name.resize(len);
    r.bytes(n->name.data(), len, "NIC name");
    n->lid = r.u16("lid");
    n->port = r.u8("port");
    uint8_t link = r.u8("link layer");
    n->mtu = r.u8("mtu");
    n->gid_index = r.u8("gid index");
    r.bytes(n->gid, 16, "gid");
    if (!r.ok()) return false;
    if (link != 1 && link != 2) return r.fail("NIC " + n->name + ": unknown link layer " + std::to_string(link));
    n->link = static_cast<LinkLayer>(link);
    if (n->mtu < 1 || n->mtu > 5) return r.fail("NIC " + n->name + ": MTU code " + std::to_string(n->mtu) + " (1..5)");
    if (n->port == 0) return r.fail("NIC " + n->name + ": port 0");
    if (n->link == LinkLayer::Ethernet && !n->has_gid()) return r.fail("NIC " + n->name + ": RoCE without a GID");
    return true;
}

bool get_nics(Reader &r, std::vector<NicAddress> *out) {
    uint16_t count = r.u16("NIC count");
    if (r.ok() && (count == 0 || count > kMaxNics))
        return r.fail("NIC count " + std::to_string(count) + " (1.." + std::to_string(kMaxNics) + ")");
    std::vector<NicAddress> nics(count);
    for (auto &n : nics)
        if (!get_nic(r, &n)) return false;
    *out = std::move(nics);
    return true;
}

void put_pairs(Writer &w, const std::vector<PairInfo> &pairs) {
    w.u32(static_cast<uint32_t>(pairs.size()));
    for (const auto &p : pairs) {
        w.u16(p.local_nic);
        w.u16(p.remote_nic);
        w.u32(p.qpn);
        w.u32(p.psn);
    }
}

bool get_pairs(Reader &r, std::vector<PairInfo> *out) {
    uint32_t count = r.u32("pair count");
    if (r.ok() && (count == 0 || count > kMaxNics * kMaxNics)) return r.fail("pair count " + std::to_string(count));
    if (r.ok() && r.left() < count * 12ull) return r.fail("truncated pair list");
    std::vector<PairInfo> pairs(count);
    for (auto &p : pairs) {
        p.local_nic = r.u16("pair local NIC");
        p.remote_nic = r.u16("pair remote NIC");
        p.qpn = r.u32("qpn");
        p.psn = r.u32("psn");
        if (r.ok() && (p.qpn == 0 || p.qpn > 0xffffff || p.psn > 0xffffff))
            return r.fail("qpn/psn out of 24-bit range");
    }
    *out = std::move(pairs);
    return r.ok();
}

bool check_magic(Reader &r, uint32_t magic, const char *what) {
    uint32_t m = r.u32("magic");
    uint16_t v = r.u16("version");
    if (!r.ok()) return false;
    if (m != magic) return r.fail(std::string("not rdma.so ") + what + " bytes (bad magic)");
    if (v != kWireVersion)
        return r.fail(std::string(what) + " version " + std::to_string(v) + ", this rdma.so speaks " +
                      std::to_string(kWireVersion));
    return true;
}

}  // namespace

bool NicAddress::has_gid() const {
    for (uint8_t b : gid)
        if (b != 0) return true;
    return false;
}

std::vector<uint8_t> encode_endpoint(const Endpoint &ep) {
    Writer w;
    w.u32(kEndpointMagic);
    w.u16(kWireVersion);
    w.u64(ep.token);
    w.bytes(ep.ip, 4);
    w.u16(ep.port);
    w.u16(static_cast<uint16_t>(ep.nics.size()));
    for (const auto &n : ep.nics) put_nic(w, n);
    return w.take();
}

bool decode_endpoint(const void *bytes, size_t len, Endpoint *out, std::string *why) {
    Reader r(bytes, len, why);
    Endpoint ep;
    if (!check_magic(r, kEndpointMagic, "endpoint")) return false;
    ep.token = r.u64("token");
    r.bytes(ep.ip, 4, "address");
    ep.port = r.u16("port");
    if (r.ok() && ep.port == 0) return r.fail("control port 0");
    if (!get_nics(r, &ep.nics) || !r.expect_end("endpoint")) return false;
    *out = std::move(ep);
    return true;
}

std::vector<uint8_t> encode_mem(const MemDescriptor &m, size_t nic_count) {
    Writer w;
    w.u32(kMemMagic);
    w.u16(kWireVersion);
    w.u16(static_cast<uint16_t>(nic_count));
    w.u64(m.nearest_nics);
    w.u32(static_cast<uint32_t>(m.chunks.size()));
    for (const auto &c : m.chunks) {
        w.u64(c.addr);
        w.u64(c.len);
        w.u32(c.access);
        for (size_t i = 0; i < nic_count; ++i) w.u32(i < c.rkeys.size() ? c.rkeys[i] : 0);
    }
    return w.take();
}

bool decode_mem(const void *bytes, size_t len, size_t nic_count, MemDescriptor *out, std::string *why) {
    Reader r(bytes, len, why);
    MemDescriptor m;
    if (!check_magic(r, kMemMagic, "memory descriptor")) return false;
    uint16_t nics = r.u16("NIC count");
    m.nearest_nics = r.u64("nearest NICs");
    uint32_t count = r.u32("chunk count");
    if (!r.ok()) return false;
    if (nics != nic_count)
        return r.fail("memory descriptor carries keys for " + std::to_string(nics) + " NICs, the peer's endpoint has " +
                      std::to_string(nic_count));
    if (r.left() < count * (20ull + 4ull * nics))
        return r.fail("memory descriptor truncated: " + std::to_string(count) + " chunks announced");
    if (nics < 64 && (m.nearest_nics >> nics) != 0) return r.fail("nearest-NIC mask names NICs the peer does not have");
    m.chunks.resize(count);
    uint64_t expect = 0;
    for (size_t i = 0; i < count; ++i) {
        RemoteChunk &c = m.chunks[i];
        c.addr = r.u64("chunk addr");
        c.len = r.u64("chunk len");
        c.access = r.u32("chunk access");
        c.rkeys.resize(nics);
        for (auto &k : c.rkeys) k = r.u32("rkey");
        if (!r.ok()) return false;
        if (c.len == 0 || c.addr + c.len < c.addr)
            return r.fail("chunk " + std::to_string(i) + " has an empty or wrapping range");
        if (i > 0 && c.addr < expect)
            return r.fail("chunk " + std::to_string(i) + " overlaps or precedes the previous one");
        if (c.access & ~3u) return r.fail("chunk " + std::to_string(i) + " has unknown access bits");
        expect = c.addr + c.len;
    }
    if (!r.expect_end("memory descriptor")) return false;
    *out = std::move(m);
    return true;
}

std::vector<uint8_t> encode_connect(const ConnectBody &b) {
    Writer w;
    w.u64(b.token);
    w.u16(static_cast<uint16_t>(b.nics.size()));
    for (const auto &n : b.nics) put_nic(w, n);
    auto head = w.take();
    Writer p;
    put_pairs(p, b.pairs);
    auto tail = p.take();
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
}

bool decode_connect(const void *bytes, size_t len, ConnectBody *out, std::string *why) {
    Reader r(bytes, len, why);
    ConnectBody b;
    b.token = r.u64("token");
    if (!get_nics(r, &b.nics) || !get_pairs(r, &b.pairs) || !r.expect_end("connect")) return false;
    for (const auto &p : b.pairs)
        if (p.local_nic >= b.nics.size())
            return r.fail("pair names initiator NIC " + std::to_string(p.local_nic) + " of " +
                          std::to_string(b.nics.size()));
    *out = std::move(b);
    return true;
}

std::vector<uint8_t> encode_connect_ack(const ConnectAckBody &b) {
    Writer w;
    put_pairs(w, b.pairs);
    return w.take();
}

bool decode_connect_ack(const void *bytes, size_t len, ConnectAckBody *out, std::string *why) {
    Reader r(bytes, len, why);
    ConnectAckBody b;
    if (!get_pairs(r, &b.pairs) || !r.expect_end("connect reply")) return false;
    *out = std::move(b);
    return true;
}

std::vector<uint8_t> encode_query(uint64_t addr, uint64_t length) {
    Writer w;
    w.u64(addr);
    w.u64(length);
    return w.take();
}

bool decode_query(const std::vector<uint8_t> &body, uint64_t *addr, uint64_t *length) {
    if (body.size() != 16) return false;
    Reader r(body.data(), body.size(), nullptr);
    *addr = r.u64("addr");
    *length = r.u64("length");
    return r.ok();
}

void encode_header(const CtrlHeader &h, uint8_t out[kCtrlHeaderSize]) {
    Writer w;
    w.u32(kCtrlMagic);
    w.u16(h.type);
    w.u16(0);
    w.u64(h.req_id);
    w.u32(static_cast<uint32_t>(h.status));
    w.u32(h.body_len);
    auto b = w.take();
    memcpy(out, b.data(), kCtrlHeaderSize);
}

bool decode_header(const uint8_t in[kCtrlHeaderSize], CtrlHeader *out, std::string *why) {
    Reader r(in, kCtrlHeaderSize, why);
    uint32_t magic = r.u32("magic");
    CtrlHeader h;
    h.type = r.u16("type");
    r.u16("reserved");
    h.req_id = r.u64("request id");
    h.status = static_cast<int32_t>(r.u32("status"));
    h.body_len = r.u32("body length");
    if (!r.ok()) return false;
    if (magic != kCtrlMagic) return r.fail("not an rdma.so control message (bad magic)");
    if (h.type < 1 || h.type > 10) return r.fail("unknown control message type " + std::to_string(h.type));
    if (h.body_len > kMaxCtrlBody) return r.fail("control message body of " + std::to_string(h.body_len) + " bytes");
    *out = h;
    return true;
}

std::string gid_string(const uint8_t gid[16]) {
    char buf[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, gid, buf, sizeof buf);
    return buf;
}

}  // namespace ferry_rdma
