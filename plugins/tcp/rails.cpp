#include "rails.hpp"

#include "plugin_util.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <cerrno>
#include <cstring>
#include <sstream>

namespace ferry_tcp {
namespace {

constexpr uint32_t kRailsMagic = 0x45545246u;  // 'F' 'R' 'T' 'E', as the single-address form
constexpr uint16_t kRailsVersion = 2;
constexpr size_t kRailsHeader = 8;  // magic, version, count, reserved
constexpr size_t kRailRecord = 20;  // family, reserved, port, 16 address bytes

struct HostAddress {
    std::string ip;
    sockaddr_storage addr{};
    sockaddr_storage mask{};
    bool up = false;
    bool loopback = false;
};

std::vector<HostAddress> host_addresses() {
    std::vector<HostAddress> out;
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) return out;
    for (ifaddrs *i = list; i != nullptr; i = i->ifa_next) {
        if (i->ifa_addr == nullptr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        HostAddress h;
        size_t len = i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
        memcpy(&h.addr, i->ifa_addr, len);
        if (i->ifa_netmask != nullptr) memcpy(&h.mask, i->ifa_netmask, len);
        h.up = (i->ifa_flags & IFF_UP) != 0;
        h.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
        char text[INET6_ADDRSTRLEN] = {};
        const void *raw = i->ifa_addr->sa_family == AF_INET
                              ? static_cast<const void *>(&reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr)
                              : static_cast<const void *>(&reinterpret_cast<sockaddr_in6 *>(i->ifa_addr)->sin6_addr);
        inet_ntop(i->ifa_addr->sa_family, raw, text, sizeof text);
        h.ip = text;
        out.push_back(std::move(h));
    }
    freeifaddrs(list);
    return out;
}

// The address bytes of an IPv4 or IPv6 sockaddr, and their count.
const uint8_t *addr_bytes(const sockaddr_storage &a, size_t *n) {
    if (a.ss_family == AF_INET6) {
        *n = 16;
        return reinterpret_cast<const uint8_t *>(&reinterpret_cast<const sockaddr_in6 *>(&a)->sin6_addr);
    }
    *n = 4;
    return reinterpret_cast<const uint8_t *>(&reinterpret_cast<const sockaddr_in *>(&a)->sin_addr);
}

bool in_subnet(const HostAddress &local, const sockaddr_storage &remote) {
    if (local.addr.ss_family != remote.ss_family || local.mask.ss_family != local.addr.ss_family) return false;
    size_t n = 0, m = 0, k = 0;
    const uint8_t *a = addr_bytes(local.addr, &n), *b = addr_bytes(remote, &m), *mask = addr_bytes(local.mask, &k);
    for (size_t i = 0; i < n; ++i)
        if ((a[i] & mask[i]) != (b[i] & mask[i])) return false;
    return true;
}

std::string listed(const std::vector<HostAddress> &host) {
    std::string s;
    for (const auto &h : host) s += (s.empty() ? "" : ", ") + h.ip;
    return s.empty() ? "none found" : s;
}

}  // namespace

int resolve_rails(const Config &cfg, std::vector<std::string> *out, std::string *why) {
    out->clear();
    if (cfg.rails.empty()) return 0;
    auto host = host_addresses();
    if (cfg.rails == "auto") {
        for (int family : {AF_INET, AF_INET6})
            for (const auto &h : host)
                if (h.up && !h.loopback && h.addr.ss_family == family && out->size() < kMaxRails) {
                    // An IPv6 link-local address needs a scope id to connect to: not a rail.
                    if (family == AF_INET6 && h.ip.rfind("fe80", 0) == 0) continue;
                    out->push_back(h.ip);
                }
        if (out->empty()) {
            *why =
                "rails=auto: this host has no address on an interface that is up, besides loopback; set "
                "tcp.rails to a list of addresses or leave it unset (bind_ip alone)";
            return -EINVAL;
        }
        return 0;
    }
    std::stringstream in(cfg.rails);
    for (std::string ip; std::getline(in, ip, ',');) {
        bool known = false;
        for (const auto &h : host) known = known || h.ip == ip;
        if (!known) {
            *why = strprintf(
                "rails: '%s' is not an address of this host (its addresses: %s); list addresses that "
                "`ip -brief address` shows, or use rails=auto",
                ip.c_str(), listed(host).c_str());
            return -EINVAL;
        }
        for (const auto &seen : *out)
            if (seen == ip) {
                *why = strprintf("rails: '%s' is listed twice; list each address once", ip.c_str());
                return -EINVAL;
            }
        out->push_back(ip);
    }
    if (out->empty() || out->size() > kMaxRails) {
        *why = strprintf("rails: '%s' names %zu addresses; list 1 to %zu, separated by commas, or use auto",
                         cfg.rails.c_str(), out->size(), kMaxRails);
        return -EINVAL;
    }
    return 0;
}

std::vector<uint8_t> encode_rails_endpoint(const std::vector<sockaddr_storage> &addrs) {
    if (addrs.size() == 1) {
        std::vector<uint8_t> one(kEndpointSize);
        encode_endpoint(addrs[0], one.data());
        return one;
    }
    std::vector<uint8_t> out(kRailsHeader + kRailRecord * addrs.size());
    put_le32(out.data(), kRailsMagic);
    put_le16(out.data() + 4, kRailsVersion);
    out[6] = static_cast<uint8_t>(addrs.size());
    for (size_t i = 0; i < addrs.size(); ++i) {
        uint8_t *r = out.data() + kRailsHeader + kRailRecord * i;
        size_t n = 0;
        const uint8_t *bytes = addr_bytes(addrs[i], &n);
        r[0] = addrs[i].ss_family == AF_INET6 ? 6 : 4;
        uint16_t port = addrs[i].ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6 *>(&addrs[i])->sin6_port
                                                       : reinterpret_cast<const sockaddr_in *>(&addrs[i])->sin_port;
        put_le16(r + 2, ntohs(port));
        memcpy(r + 4, bytes, n);
    }
    return out;
}

bool decode_rails_endpoint(const void *buf, size_t len, std::vector<Endpoint> *out, std::string *why) {
    out->clear();
    const auto *p = static_cast<const uint8_t *>(buf);
    if (buf != nullptr && len >= kRailsHeader && get_le32(p) == kRailsMagic && get_le16(p + 4) == kRailsVersion) {
        size_t n = p[6];
        if (n < 2 || n > kMaxRails || len != kRailsHeader + kRailRecord * n) {
            *why = strprintf("tcp endpoint with %zu rails is %zu bytes; 2..%zu rails of %zu bytes each expected", n,
                             len, kMaxRails, kRailRecord);
            return false;
        }
        for (size_t i = 0; i < n; ++i) {
            // Each record is the single-address form's family, port and address bytes.
            uint8_t one[kEndpointSize] = {};
            const uint8_t *r = p + kRailsHeader + kRailRecord * i;
            put_le32(one, kRailsMagic);
            put_le16(one + 4, 1);
            one[6] = r[0];
            memcpy(one + 8, r + 2, 2);
            memcpy(one + 12, r + 4, 16);
            Endpoint ep;
            if (!decode_endpoint(one, sizeof one, &ep, why)) {
                *why = strprintf("rail %zu: %s", i, why->c_str());
                out->clear();
                return false;
            }
            out->push_back(std::move(ep));
        }
        return true;
    }
    Endpoint ep;
    if (!decode_endpoint(buf, len, &ep, why)) return false;
    out->push_back(std::move(ep));
    return true;
}

std::vector<RailPlan> plan_rails(const std::vector<std::string> &local, const std::vector<Endpoint> &remote,
                                 bool automatic) {
    std::vector<RailPlan> plans;
    if (local.empty()) {
        plans.push_back({0, 0, {}, 0, remote[0].name});
        return plans;
    }
    auto host = host_addresses();
    bool any_matched = false;
    std::vector<std::pair<size_t, bool>> choice;  // remote index, matched by subnet
    for (size_t i = 0; i < local.size(); ++i) {
        const HostAddress *me = nullptr;
        for (const auto &h : host)
            if (h.ip == local[i]) me = &h;
        size_t pick = i % remote.size();
        bool matched = false;
        for (size_t r = 0; me != nullptr && r < remote.size() && !matched; ++r)
            if (in_subnet(*me, remote[r].addr)) pick = r, matched = true;
        // Same family at least: an IPv4 source cannot reach an IPv6 peer address.
        if (!matched && me != nullptr && remote[pick].addr.ss_family != me->addr.ss_family) {
            for (size_t r = 0; r < remote.size(); ++r)
                if (remote[r].addr.ss_family == me->addr.ss_family) {
                    pick = r;
                    break;
                }
        }
        any_matched = any_matched || matched;
        choice.emplace_back(pick, matched);
    }
    for (size_t i = 0; i < local.size(); ++i) {
        if (automatic && any_matched && !choice[i].second) continue;
        RailPlan p;
        p.local = i;
        p.remote = choice[i].first;
        for (const auto &h : host)
            if (h.ip == local[i]) {
                p.source = h.addr;
                if (p.source.ss_family == AF_INET) reinterpret_cast<sockaddr_in *>(&p.source)->sin_port = 0;
                else reinterpret_cast<sockaddr_in6 *>(&p.source)->sin6_port = 0;
                p.source_len = p.source.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
            }
        p.name = local[i] + " -> " + remote[p.remote].name;
        plans.push_back(std::move(p));
    }
    return plans;
}

}  // namespace ferry_tcp
