#include "wire_format.hpp"

#include <charconv>
#include <cstring>

namespace ferry_nixl {
namespace {

constexpr std::string_view kConnTag = "ferry-nixl/1 ";
constexpr std::string_view kRegionTag = "ferry-nixl/1";
constexpr std::string_view kNotifTag = "FNX1";
// Agent names are short identifiers; a larger length means the bytes are not ours.
constexpr uint32_t kMaxAgentName = 4096;

template <class T>
bool parse_number(std::string_view text, T &out, int base = 10) {
    if (text.empty()) return false;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, base);
    return ec == std::errc() && end == text.data() + text.size();
}

// Splits "key=value" off the front of `rest` at the next ';'.
bool take_field(std::string_view &rest, std::string_view key, std::string_view &value) {
    if (rest.substr(0, key.size()) != key || rest.size() <= key.size() || rest[key.size()] != '=') return false;
    rest.remove_prefix(key.size() + 1);
    auto end = rest.find(';');
    if (end == std::string_view::npos) return false;
    value = rest.substr(0, end);
    rest.remove_prefix(end + 1);
    return true;
}

}  // namespace

std::string encode_conn_info(std::string_view segment_name) {
    std::string out(kConnTag);
    out += segment_name;
    return out;
}

std::optional<std::string> decode_conn_info(std::string_view blob) {
    if (blob.substr(0, kConnTag.size()) != kConnTag || blob.size() == kConnTag.size()) return std::nullopt;
    return std::string(blob.substr(kConnTag.size()));
}

std::string encode_region(const RegionInfo &r) {
    char addr[32];
    auto end = std::to_chars(addr, addr + sizeof addr, r.addr, 16).ptr;
    std::string out(kRegionTag);
    out += ";addr=";
    out.append(addr, end);
    out += ";len=" + std::to_string(r.length);
    out += ";kind=" + std::to_string(r.memory_kind);
    out += ";dev=" + std::to_string(r.device);
    out += ";seg=";
    out += r.segment;  // last: a segment name may contain any character
    return out;
}

std::optional<RegionInfo> decode_region(std::string_view blob) {
    if (blob.substr(0, kRegionTag.size()) != kRegionTag || blob.size() == kRegionTag.size() ||
        blob[kRegionTag.size()] != ';')
        return std::nullopt;
    std::string_view rest = blob.substr(kRegionTag.size() + 1);
    std::string_view addr, len, kind, dev;
    RegionInfo r;
    if (!take_field(rest, "addr", addr) || !parse_number(addr, r.addr, 16)) return std::nullopt;
    if (!take_field(rest, "len", len) || !parse_number(len, r.length)) return std::nullopt;
    if (!take_field(rest, "kind", kind) || !parse_number(kind, r.memory_kind)) return std::nullopt;
    if (!take_field(rest, "dev", dev) || !parse_number(dev, r.device)) return std::nullopt;
    if (rest.substr(0, 4) != "seg=" || rest.size() == 4) return std::nullopt;
    r.segment = std::string(rest.substr(4));
    return r;
}

std::string encode_notification(std::string_view agent, std::string_view message) {
    std::string out(kNotifTag);
    uint32_t n = static_cast<uint32_t>(agent.size());
    unsigned char len[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                            static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
    out.append(reinterpret_cast<const char *>(len), sizeof len);
    out += agent;
    out += message;
    return out;
}

std::optional<AgentMessage> decode_notification(std::string_view bytes) {
    if (bytes.size() < kNotifTag.size() + 4 || bytes.substr(0, kNotifTag.size()) != kNotifTag) return std::nullopt;
    auto *len = reinterpret_cast<const unsigned char *>(bytes.data() + kNotifTag.size());
    uint32_t n = uint32_t(len[0]) | uint32_t(len[1]) << 8 | uint32_t(len[2]) << 16 | uint32_t(len[3]) << 24;
    bytes.remove_prefix(kNotifTag.size() + 4);
    if (n == 0 || n > kMaxAgentName || n > bytes.size()) return std::nullopt;
    return AgentMessage{std::string(bytes.substr(0, n)), std::string(bytes.substr(n))};
}

}  // namespace ferry_nixl
