// Minimal JSON writer for reports (ferry-info --json, bench --json). Output only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ferry {

class JsonWriter {
public:
    JsonWriter &begin_object() {
        sep();
        out_ += '{';
        first_ = true;
        return *this;
    }
    JsonWriter &end_object() {
        out_ += '}';
        first_ = false;
        return *this;
    }
    JsonWriter &begin_array() {
        sep();
        out_ += '[';
        first_ = true;
        return *this;
    }
    JsonWriter &end_array() {
        out_ += ']';
        first_ = false;
        return *this;
    }
    JsonWriter &key(std::string_view k) {
        sep();
        quote(k);
        out_ += ':';
        first_ = true;
        return *this;
    }
    JsonWriter &value(std::string_view v) {
        sep();
        quote(v);
        return *this;
    }
    JsonWriter &value(const char *v) { return value(std::string_view(v)); }
    JsonWriter &value(bool v) {
        sep();
        out_ += v ? "true" : "false";
        return *this;
    }
    JsonWriter &value(int64_t v) {
        sep();
        out_ += std::to_string(v);
        return *this;
    }
    JsonWriter &value(uint64_t v) {
        sep();
        out_ += std::to_string(v);
        return *this;
    }
    JsonWriter &value(int v) { return value(static_cast<int64_t>(v)); }
    JsonWriter &value(unsigned v) { return value(static_cast<uint64_t>(v)); }
    JsonWriter &value(double v) {
        sep();
        char buf[64];
        snprintf(buf, sizeof buf, "%.6g", v);
        out_ += buf;
        return *this;
    }
    JsonWriter &null() {
        sep();
        out_ += "null";
        return *this;
    }
    template <class T>
    JsonWriter &field(std::string_view k, const T &v) {
        key(k);
        return value(v);
    }
    const std::string &str() const { return out_; }

private:
    void sep() {
        if (!first_) out_ += ',';
        first_ = false;
    }
    void quote(std::string_view s) {
        out_ += '"';
        for (unsigned char c : s) {
            switch (c) {
                case '"': out_ += "\\\""; break;
                case '\\': out_ += "\\\\"; break;
                case '\n': out_ += "\\n"; break;
                case '\r': out_ += "\\r"; break;
                case '\t': out_ += "\\t"; break;
                default:
                    if (c < 0x20) {
                        char buf[8];
                        snprintf(buf, sizeof buf, "\\u%04x", c);
                        out_ += buf;
                    } else {
                        out_ += static_cast<char>(c);
                    }
            }
        }
        out_ += '"';
    }
    std::string out_;
    bool first_ = true;
};

}  // namespace ferry
