#include "wire.hpp"

#include "util.hpp"

#include <arpa/inet.h>
#include <cstring>

namespace ferry_tcp {

namespace {

constexpr uint32_t kEndpointMagic = 0x45545246u;  // bytes 'F' 'R' 'T' 'E'
constexpr uint16_t kEndpointVersion = 1;

void put16(uint8_t *p, uint16_t v) {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
}
void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t get16(const uint8_t *p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

}  // namespace

void encode_header(const Header &h, uint8_t out[kHeaderSize]) {
    put32(out + 0, h.magic);
    put16(out + 4, h.version);
    out[6] = h.type;
    out[7] = h.flags;
    put32(out + 8, static_cast<uint32_t>(h.status));
    put32(out + 12, h.msg_len);
    put64(out + 16, h.id);
    put64(out + 24, h.addr);
    put64(out + 32, h.length);
}

Header decode_header(const uint8_t in[kHeaderSize]) {
    Header h;
    h.magic = get32(in + 0);
    h.version = get16(in + 4);
    h.type = in[6];
    h.flags = in[7];
    h.status = static_cast<int32_t>(get32(in + 8));
    h.msg_len = get32(in + 12);
    h.id = get64(in + 16);
    h.addr = get64(in + 24);
    h.length = get64(in + 32);
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
    put32(out + 0, kEndpointMagic);
    put16(out + 4, kEndpointVersion);
    if (addr.ss_family == AF_INET6) {
        const auto *a = reinterpret_cast<const sockaddr_in6 *>(&addr);
        out[6] = 6;
        put16(out + 8, ntohs(a->sin6_port));
        memcpy(out + 12, &a->sin6_addr, 16);
    } else {
        const auto *a = reinterpret_cast<const sockaddr_in *>(&addr);
        out[6] = 4;
        put16(out + 8, ntohs(a->sin_port));
        memcpy(out + 12, &a->sin_addr, 4);
    }
}

bool decode_endpoint(const void *buf, size_t len, Endpoint *ep, std::string *why) {
    const auto *p = static_cast<const uint8_t *>(buf);
    if (buf == nullptr || len != kEndpointSize) {
        *why = strprintf("endpoint is %zu bytes, a tcp endpoint is %zu", buf ? len : 0, kEndpointSize);
        return false;
    }
    if (get32(p) != kEndpointMagic) {
        *why = "endpoint bytes are not a tcp endpoint (bad magic)";
        return false;
    }
    if (get16(p + 4) != kEndpointVersion) {
        *why =
            strprintf("tcp endpoint version %u not supported (this plugin reads %u)", get16(p + 4), kEndpointVersion);
        return false;
    }
    uint16_t port = get16(p + 8);
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
