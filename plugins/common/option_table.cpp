#include "option_table.hpp"

#include "plugin_util.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace ferry_plugin {
namespace {

// Unsigned decimal; with `sizes`, one optional k/m/g suffix (KiB/MiB/GiB). Rejects signs,
// spaces, empty strings and overflow.
bool parse_number(const char *s, bool sizes, uint64_t *out) {
    if (s == nullptr || *s == '\0') return false;
    uint64_t v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; ++p) {
        uint64_t d = static_cast<uint64_t>(*p - '0');
        if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
        v = v * 10 + d;
    }
    if (p == s) return false;
    if (*p != '\0') {
        if (!sizes || p[1] != '\0') return false;
        unsigned shift = 0;
        switch (*p) {
            case 'k':
            case 'K': shift = 10; break;
            case 'm':
            case 'M': shift = 20; break;
            case 'g':
            case 'G': shift = 30; break;
            default: return false;
        }
        if (v > (std::numeric_limits<uint64_t>::max() >> shift)) return false;
        v <<= shift;
    }
    *out = v;
    return true;
}

bool parse_flag(const char *s, uint64_t *out) {
    for (const char *t : {"1", "true", "yes", "on"})
        if (strcmp(s, t) == 0) return *out = 1, true;
    for (const char *f : {"0", "false", "no", "off"})
        if (strcmp(s, f) == 0) return *out = 0, true;
    return false;
}

bool is_word_of(const char *s, const char *values) {
    std::string_view list = values ? values : "", want = s;
    while (!list.empty()) {
        size_t bar = list.find('|');
        if (list.substr(0, bar) == want) return true;
        if (bar == std::string_view::npos) break;
        list.remove_prefix(bar + 1);
    }
    return false;
}

// 4096 -> "4k", 1 GiB -> "1g": sizes as a user writes them.
std::string size_text(uint64_t v) {
    if (v != 0 && v % (1ull << 30) == 0) return std::to_string(v >> 30) + "g";
    if (v != 0 && v % (1ull << 20) == 0) return std::to_string(v >> 20) + "m";
    if (v != 0 && v % (1ull << 10) == 0) return std::to_string(v >> 10) + "k";
    return std::to_string(v);
}

size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
            diag = up;
        }
    }
    return row[b.size()];
}

// What a user sees of a value: bounded, so a megabyte of garbage does not fill the message.
std::string shown(const char *value) {
    if (value == nullptr) return "(null)";
    std::string_view v = value;
    return v.size() <= 48 ? std::string(v) : std::string(v.substr(0, 45)) + "...";
}

}  // namespace

int options_detail::invalid(const char *plugin, const ferry_option_desc_t &d, const char *value, ferry_error_t *err) {
    std::string accepted = accepted_text(d);
    std::string def = d.default_text && *d.default_text ? std::string(" (default ") + d.default_text + ")" : "";
    if (d.type == FERRY_OPTION_SECRET)  // never echoed
        return set_error(err, -EINVAL, "%s: invalid value for option '%s': expected %s", plugin, d.name,
                         accepted.c_str());
    return set_error(err, -EINVAL, "%s: invalid value '%s' for option '%s': expected %s%s", plugin,
                     shown(value).c_str(), d.name, accepted.c_str(), def.c_str());
}

std::string accepted_text(const ferry_option_desc_t &d) {
    if (d.accepted != nullptr && *d.accepted != '\0') return d.accepted;
    const bool open = d.max == std::numeric_limits<uint64_t>::max();
    switch (d.type) {
        case FERRY_OPTION_UINT:
            return open ? "an integer of at least " + std::to_string(d.min)
                        : "an integer from " + std::to_string(d.min) + " to " + std::to_string(d.max);
        case FERRY_OPTION_SIZE:
            return (open ? "a size of at least " + size_text(d.min)
                         : "a size from " + size_text(d.min) + " to " + size_text(d.max)) +
                   " bytes (suffixes k, m, g)";
        case FERRY_OPTION_DURATION_MS:
            return open ? "milliseconds, at least " + std::to_string(d.min)
                        : "milliseconds from " + std::to_string(d.min) + " to " + std::to_string(d.max);
        case FERRY_OPTION_BOOL: return "true or false";
        case FERRY_OPTION_ENUM: {
            std::string_view list = d.values ? d.values : "";
            std::vector<std::string_view> words;
            for (size_t bar; (bar = list.find('|')) != std::string_view::npos; list.remove_prefix(bar + 1))
                words.push_back(list.substr(0, bar));
            words.push_back(list);
            std::string out = "one of ";
            for (size_t i = 0; i < words.size(); ++i)
                out += std::string(i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + std::string(words[i]);
            return out;
        }
        case FERRY_OPTION_SECRET: return "a non-empty value";
        default: return "a string";
    }
}

namespace options_detail {

bool check(const char *plugin, const ferry_option_desc_t &d, const char *value, OptionValue &out, ferry_error_t *err) {
    if (value == nullptr) return options_detail::invalid(plugin, d, value, err), false;
    out.text = value;
    bool ok = true;
    switch (d.type) {
        case FERRY_OPTION_UINT:
        case FERRY_OPTION_DURATION_MS:
        case FERRY_OPTION_SIZE:
            ok = parse_number(value, d.type == FERRY_OPTION_SIZE, &out.number) && out.number >= d.min &&
                 out.number <= d.max;
            break;
        case FERRY_OPTION_BOOL: ok = parse_flag(value, &out.number); break;
        case FERRY_OPTION_ENUM: ok = is_word_of(value, d.values); break;
        case FERRY_OPTION_SECRET: ok = *value != '\0'; break;
        default: break;  // STRING: the store function checks it
    }
    if (!ok) invalid(plugin, d, value, err);
    return ok;
}

int unknown(const char *plugin, const ferry_option_desc_t *descs, size_t n, const char *key, ferry_error_t *err) {
    std::string known, guess;
    size_t best = 3;  // suggest only a near miss: at most two edits
    for (size_t i = 0; i < n; ++i) {
        known += (i ? ", " : "") + std::string(descs[i].name);
        size_t dist = edit_distance(key, descs[i].name);
        if (dist < best) best = dist, guess = descs[i].name;
    }
    std::string hint = guess.empty() ? "" : " (did you mean '" + guess + "'?)";
    // The list goes last: FERRY_MESSAGE_MAX may cut it, never the key or the hint.
    return set_error(err, -EINVAL, "%s: unknown option '%s'%s; `ferry-info --options %s` describes each; known: %s",
                     plugin, shown(key).c_str(), hint.c_str(), plugin, known.c_str());
}

int null_key(const char *plugin, size_t index, ferry_error_t *err) {
    return set_error(err, -EINVAL, "%s: option #%zu has a NULL key (or the options array is NULL)", plugin, index);
}

}  // namespace options_detail

}  // namespace ferry_plugin
