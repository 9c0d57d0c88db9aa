#include "wire.hpp"

#include "plugin_util.hpp"

#include <arpa/inet.h>
#include <cstring>

namespace ferry_tcp {

namespace {

constexpr uint32_t kEndpointMagic = 0x45545246u;  // bytes 'F' 'R' 'T' 'E'
constexpr uint16_t kEndpointVersion = 1;

}  // namespace

void encode_header(const Header &h, uint8_t out[kHeaderSize]) {
    put_le32(out + 0, h.magic);
    put_le16(out + 4, h.version);
    out[6] = h.type;
    out[7] = h.flags;
    put_le32(out + 8, static_cast<uint32_t>(h.status));
    put_le32(out + 12, h.msg_len);
    put_le64(out + 16, h.id);
    put_le64(out + 24, h.addr);
    put_le64(out + 32, h.length);
}

Header decode_header(const uint8_t in[kHeaderSize]) {
    Header h;
    h.magic = get_le32(in + 0);
    h.version = get_le16(in + 4);
    h.type = in[6];
    h.flags = in[7];
    h.status = static_cast<int32_t>(get_le32(in + 8));
    h.msg_len = get_le32(in + 12);
    h.id = get_le64(in + 16);
    h.addr = get_le64(in + 24);
    h.length = get_le64(in + 32);
    return h;
}

const char *msg_type_name(uint8_t type) {
    switch (type) {
        case kHello: return "HELLO";
        case kHelloAck: return "HELLO_ACK";
        case kAuth: return "AUTH";
        case kAuthAck: return "AUTH_ACK";
        case kWriteReq: return "WRITE_REQ";
        case kWriteAck: return "WRITE_ACK";
        case kReadReq: return "READ_REQ";
        case kReadResp: return "READ_RESP";
        case kError: return "ERROR";
        case kReadDone: return "READ_DONE";
        default: return "unknown";
    }
}

bool check_request(const Header &h, std::string *why) {
    if (h.magic != kWireMagic) {
        *why = strprintf("bad magic 0x%08x", h.magic);
        return false;
    }
    if (h.version != kWireVersion) {
        *why = strprintf("wire version %u in a request, connection speaks %u", h.version, kWireVersion);
        return false;
    }
    if (h.type != kWriteReq && h.type != kReadReq && h.type != kReadDone) {
        *why = strprintf("unexpected message type %u (%s) from a client", h.type, msg_type_name(h.type));
        return false;
    }
    if (h.flags != 0 || h.status != 0 || h.msg_len != 0) {
        *why = strprintf("%s with non-zero flags/status/msg_len (%u/%d/%u)", msg_type_name(h.type), h.flags, h.status,
                         h.msg_len);
        return false;
    }
    if (h.type == kReadDone) {
        if (h.length == 0 || h.length > UINT32_MAX || h.addr != 0) {
            *why = strprintf("READ_DONE for %llu responses", static_cast<unsigned long long>(h.length));
            return false;
        }
        return true;
    }
    if (h.length == 0 || h.length > kMaxPayload) {
        *why = strprintf("%s length %llu outside 1..%llu", msg_type_name(h.type),
                         static_cast<unsigned long long>(h.length), static_cast<unsigned long long>(kMaxPayload));
        return false;
    }
    return true;
}

void encode_endpoint(const sockaddr_storage &addr, uint8_t out[kEndpointSize]) {
    memset(out, 0, kEndpointSize);
    put_le32(out + 0, kEndpointMagic);
    put_le16(out + 4, kEndpointVersion);
    if (addr.ss_family == AF_INET6) {
        const auto *a = reinterpret_cast<const sockaddr_in6 *>(&addr);
        out[6] = 6;
        put_le16(out + 8, ntohs(a->sin6_port));
        memcpy(out + 12, &a->sin6_addr, 16);
    } else {
        const auto *a = reinterpret_cast<const sockaddr_in *>(&addr);
        out[6] = 4;
        put_le16(out + 8, ntohs(a->sin_port));
        memcpy(out + 12, &a->sin_addr, 4);
    }
}

bool decode_endpoint(const void *buf, size_t len, Endpoint *ep, std::string *why) {
    const auto *p = static_cast<const uint8_t *>(buf);
    if (buf == nullptr || len != kEndpointSize) {
        *why = strprintf("endpoint is %zu bytes, a tcp endpoint is %zu", buf ? len : 0, kEndpointSize);
        return false;
    }
    if (get_le32(p) != kEndpointMagic) {
        *why = "endpoint bytes are not a tcp endpoint (bad magic)";
        return false;
    }
    if (get_le16(p + 4) != kEndpointVersion) {
        *why = strprintf("tcp endpoint version %u not supported (this plugin reads %u)", get_le16(p + 4),
                         kEndpointVersion);
        return false;
    }
    uint16_t port = get_le16(p + 8);
    if (port == 0) {
        *why = "tcp endpoint has port 0";
        return false;
    }
    Endpoint e;
    if (p[6] == 4) {
        auto *a = reinterpret_cast<sockaddr_in *>(&e.addr);
        a->sin_family = AF_INET;
        a->sin_port = htons(port);
        memcpy(&a->sin_addr, p + 12, 4);
        e.addr_len = sizeof(sockaddr_in);
    } else if (p[6] == 6) {
        auto *a = reinterpret_cast<sockaddr_in6 *>(&e.addr);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(port);
        memcpy(&a->sin6_addr, p + 12, 16);
        e.addr_len = sizeof(sockaddr_in6);
    } else {
        *why = strprintf("tcp endpoint has unknown address family %u", p[6]);
        return false;
    }
    e.name = sockaddr_name(e.addr);
    *ep = std::move(e);
    return true;
}

std::string sockaddr_name(const sockaddr_storage &addr) {
    char ip[INET6_ADDRSTRLEN] = "?";
    if (addr.ss_family == AF_INET6) {
        const auto *a = reinterpret_cast<const sockaddr_in6 *>(&addr);
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        return strprintf("[%s]:%u", ip, ntohs(a->sin6_port));
    }
    const auto *a = reinterpret_cast<const sockaddr_in *>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    return strprintf("%s:%u", ip, ntohs(a->sin_port));
}

}  // namespace ferry_tcp
