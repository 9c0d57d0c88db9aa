// etcd's v3 JSON gateway in nlohmann-json: its requests, and reading its answers without trusting
// their types. The gateway writes proto3 JSON: 64-bit integers as strings ("revision":"12"), and
// fields at their default (false, 0, "", an empty list) left out. So a missing field reads as its
// default, an integer is taken from a number or a decimal string, and a field of another type
// than expected reads as missing too.
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ferry/result.hpp"
#include "util/log.hpp"

namespace ferry::etcd_json {

// Requests keep their members in the order written.
using Request = nlohmann::ordered_json;
using Json = nlohmann::json;

// A request's text. A string that is not UTF-8 (a password, say) goes with U+FFFD for each bad
// byte, as etcd (Go's encoding/json) would read it anyway.
inline std::string text(const Request &request) {
    return request.dump(-1, ' ', false, Request::error_handler_t::replace);
}

inline Result<Json> parse(std::string_view text) {
    try {
        return Json::parse(text);
    } catch (const Json::exception &e) {
        return fail(-EPROTO, cat("etcd answered with malformed JSON: ", e.what()));
    }
}

// The member at `path` (each step an object's member), or nullptr where a step is missing or
// not an object.
inline const Json *find(const Json &j, std::initializer_list<const char *> path) {
    const Json *at = &j;
    for (const char *key : path) {
        if (!at->is_object()) return nullptr;
        auto it = at->find(key);
        if (it == at->end()) return nullptr;
        at = &*it;
    }
    return at;
}

// A string member: `fallback` when missing, nullopt when it is there but not a string.
inline std::optional<std::string> string_at(const Json &j, std::initializer_list<const char *> path,
                                            std::string fallback = {}) {
    const Json *v = find(j, path);
    if (!v) return fallback;
    if (!v->is_string()) return std::nullopt;
    return v->get<std::string>();
}

// A string member, `fallback` when missing or not a string.
inline std::string string_or(const Json &j, std::initializer_list<const char *> path, std::string fallback) {
    const Json *v = find(j, path);
    return v && v->is_string() ? v->get<std::string>() : fallback;
}

// An int64 member (a number, or a string of decimal digits), `fallback` when missing or anything
// else.
inline int64_t int_or(const Json &j, std::initializer_list<const char *> path, int64_t fallback = 0) {
    const Json *v = find(j, path);
    if (!v) return fallback;
    if (v->is_number_unsigned())
        return v->get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()) ? v->get<int64_t>() : fallback;
    if (v->is_number_integer()) return v->get<int64_t>();
    if (!v->is_string()) return fallback;
    const auto &s = v->get_ref<const std::string &>();
    int64_t out = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size() ? out : fallback;
}

// A boolean member, `fallback` when missing or not a boolean.
inline bool bool_or(const Json &j, std::initializer_list<const char *> path, bool fallback = false) {
    const Json *v = find(j, path);
    return v && v->is_boolean() ? v->get<bool>() : fallback;
}

}  // namespace ferry::etcd_json
