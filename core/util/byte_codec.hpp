// Little-endian byte writer and a bounds-checked reader for everything Ferry puts on the
// wire or in descriptors. The reader never reads past its span: every getter reports failure
// instead, so a decoder fed garbage fails cleanly.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace ferry {

class ByteWriter {
public:
    void u8(uint8_t v) { out_.push_back(v); }
    void u16(uint16_t v) { put(v, 2); }
    void u32(uint32_t v) { put(v, 4); }
    void u64(uint64_t v) { put(v, 8); }
    void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
    void bytes(std::span<const uint8_t> b) {
        u32(static_cast<uint32_t>(b.size()));
        out_.insert(out_.end(), b.begin(), b.end());
    }
    void str(std::string_view s) { bytes({reinterpret_cast<const uint8_t *>(s.data()), s.size()}); }
    std::vector<uint8_t> take() { return std::move(out_); }
    const std::vector<uint8_t> &data() const { return out_; }

private:
    void put(uint64_t v, int n) {
        for (int i = 0; i < n; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
    std::vector<uint8_t> out_;
};

class ByteReader {
public:
    explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}

    bool u8(uint8_t &v) { return get(v, 1); }
    bool u16(uint16_t &v) { return get(v, 2); }
    bool u32(uint32_t &v) { return get(v, 4); }
    bool u64(uint64_t &v) { return get(v, 8); }
    bool i32(int32_t &v) {
        uint32_t u;
        if (!u32(u)) return false;
        v = static_cast<int32_t>(u);
        return true;
    }
    // A length-prefixed byte string of at most `max` bytes.
    bool bytes(std::vector<uint8_t> &v, size_t max) {
        uint32_t n;
        if (!u32(n) || n > max || n > remaining()) return false;
        v.assign(in_.begin() + pos_, in_.begin() + pos_ + n);
        pos_ += n;
        return true;
    }
    bool str(std::string &v, size_t max) {
        uint32_t n;
        if (!u32(n) || n > max || n > remaining()) return false;
        v.assign(reinterpret_cast<const char *>(in_.data()) + pos_, n);
        pos_ += n;
        return true;
    }
    size_t remaining() const { return in_.size() - pos_; }
    size_t position() const { return pos_; }

private:
    template <class T>
    bool get(T &v, int n) {
        if (remaining() < static_cast<size_t>(n)) return false;
        uint64_t acc = 0;
        for (int i = 0; i < n; ++i) acc |= static_cast<uint64_t>(in_[pos_ + i]) << (8 * i);
        pos_ += n;
        v = static_cast<T>(acc);
        return true;
    }
    std::span<const uint8_t> in_;
    size_t pos_ = 0;
};

}  // namespace ferry
