// A plugin's options as one declarative table: key, type, default, range, help and where the value
// goes. The same table parses `create`'s key/values (unknown keys, malformed and out-of-range
// values fail with -EINVAL and a message naming the key, the value, what is accepted and the
// default) and is published to the host as plain C (ferry_plugin_v1_t.options, ABI 1.2), from
// which `ferry-info --options` prints the documentation. Builds against plugin.h and the kit's
// plugin_util (set_error).
//
//   constexpr auto kOptions = ferry_plugin::make_options<Config>("tcp",
//       ferry_plugin::uint_option<Config>("lanes", "2", 1, 64, "connections per peer",
//                                         ferry_plugin::store<&Config::lanes>),
//       ...);
//   int rc = kOptions.parse(options, n, cfg, err);
//   ... ferry_plugin::with_options(entry_table<...>(...), kOptions) publishes it.
#pragma once

#include <ferry/plugin.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace ferry_plugin {

// A value that passed its option's type and range check, as the store function receives it.
struct OptionValue {
    const char *text = "";  // the value as given (never NULL)
    uint64_t number = 0;    // UINT, SIZE, DURATION_MS: the parsed number; BOOL: 0 or 1
    bool flag() const { return number != 0; }
};

// Puts a checked value into the Config; returns false when the value breaks a rule of the
// option's own (the row's `accepted` text says which), and the parse fails naming it.
template <class Config>
using OptionStore = bool (*)(Config &, const OptionValue &);

template <class Config>
struct OptionRow {
    ferry_option_desc_t desc;
    OptionStore<Config> store;
};

// ---- rows, one helper per type (ferry_option_type_t) ----
template <class Config>
constexpr OptionRow<Config> uint_option(const char *name, const char *def, uint64_t min, uint64_t max, const char *help,
                                        OptionStore<Config> store, const char *accepted = nullptr) {
    return {{name, FERRY_OPTION_UINT, 0, def, min, max, nullptr, accepted, help}, store};
}
template <class Config>
constexpr OptionRow<Config> size_option(const char *name, const char *def, uint64_t min, uint64_t max, const char *help,
                                        OptionStore<Config> store, const char *accepted = nullptr) {
    return {{name, FERRY_OPTION_SIZE, 0, def, min, max, nullptr, accepted, help}, store};
}
template <class Config>
constexpr OptionRow<Config> duration_option(const char *name, const char *def, uint64_t min, uint64_t max,
                                            const char *help, OptionStore<Config> store,
                                            const char *accepted = nullptr) {
    return {{name, FERRY_OPTION_DURATION_MS, 0, def, min, max, nullptr, accepted, help}, store};
}
template <class Config>
constexpr OptionRow<Config> bool_option(const char *name, const char *def, const char *help,
                                        OptionStore<Config> store) {
    return {{name, FERRY_OPTION_BOOL, 0, def, 0, 1, nullptr, nullptr, help}, store};
}
template <class Config>
constexpr OptionRow<Config> string_option(const char *name, const char *def, const char *accepted, const char *help,
                                          OptionStore<Config> store) {
    return {{name, FERRY_OPTION_STRING, 0, def, 0, 0, nullptr, accepted, help}, store};
}
// `values`: the accepted words separated by '|'.
template <class Config>
constexpr OptionRow<Config> enum_option(const char *name, const char *def, const char *values, const char *help,
                                        OptionStore<Config> store, const char *accepted = nullptr) {
    return {{name, FERRY_OPTION_ENUM, 0, def, 0, 0, values, accepted, help}, store};
}
// Never printed: messages about it name the key and what is accepted, not the value.
template <class Config>
constexpr OptionRow<Config> secret_option(const char *name, const char *accepted, const char *help,
                                          OptionStore<Config> store) {
    return {{name, FERRY_OPTION_SECRET, 0, "", 0, 0, nullptr, accepted, help}, store};
}

// ---- store functions for plain members ----
template <class T>
struct member_of;
template <class C, class T>
struct member_of<T C::*> {
    using config = C;
    using type = T;
};

// Assigns the number (integers, bool) or the text (std::string) to the member.
template <auto Member>
bool store(typename member_of<decltype(Member)>::config &c, const OptionValue &v) {
    using T = typename member_of<decltype(Member)>::type;
    if constexpr (std::is_same_v<T, std::string>) c.*Member = v.text;
    else if constexpr (std::is_same_v<T, bool>) c.*Member = v.flag();
    else c.*Member = static_cast<T>(v.number);
    return true;
}

// The type-independent half: one option's check, the messages, the lookup. option_table.cpp.
namespace options_detail {
// Checks `value` against `d`'s type and range; on success fills `out`, else writes the message.
bool check(const char *plugin, const ferry_option_desc_t &d, const char *value, OptionValue &out, ferry_error_t *err);
// -EINVAL naming the key, the value (never a SECRET's), what is accepted and the default.
int invalid(const char *plugin, const ferry_option_desc_t &d, const char *value, ferry_error_t *err);
int unknown(const char *plugin, const ferry_option_desc_t *descs, size_t n, const char *key, ferry_error_t *err);
int null_key(const char *plugin, size_t index, ferry_error_t *err);
}  // namespace options_detail

// What `values`/`accepted`/type and range say is accepted, in words ("an integer from 1 to 64").
std::string accepted_text(const ferry_option_desc_t &d);

template <class Config, size_t N>
class OptionTable {
public:
    template <class... Rows>
    constexpr OptionTable(const char *plugin, const Rows &...rows)
        : plugin_(plugin), descs_{rows.desc...}, stores_{rows.store...} {}

    // Parses key/values over the Config's defaults already in `cfg`; on failure `cfg` may hold
    // some of the values and the message names the offending key. Later keys win over earlier.
    int parse(const ferry_kv_t *options, size_t n, Config &cfg, ferry_error_t *err) const {
        if (options == nullptr && n != 0) return options_detail::null_key(plugin_, n, err);
        for (size_t i = 0; i < n; ++i) {
            const char *key = options[i].key;
            if (key == nullptr) return options_detail::null_key(plugin_, i, err);
            const ferry_option_desc_t *d = find(key);
            if (d == nullptr) return options_detail::unknown(plugin_, descs_.data(), N, key, err);
            OptionValue v;
            if (!options_detail::check(plugin_, *d, options[i].value, v, err)) return -EINVAL;
            if (!stores_[static_cast<size_t>(d - descs_.data())](cfg, v))
                return options_detail::invalid(plugin_, *d, options[i].value, err);
        }
        return 0;
    }

    const ferry_option_desc_t *find(std::string_view key) const {
        for (const auto &d : descs_)
            if (key == d.name) return &d;
        return nullptr;
    }
    constexpr const ferry_option_desc_t *descs() const { return descs_.data(); }
    constexpr size_t size() const { return N; }
    constexpr const char *plugin() const { return plugin_; }

private:
    const char *plugin_;
    std::array<ferry_option_desc_t, N> descs_;
    std::array<OptionStore<Config>, N> stores_;
};

template <class Config, class... Rows>
constexpr OptionTable<Config, sizeof...(Rows)> make_options(const char *plugin, const Rows &...rows) {
    return OptionTable<Config, sizeof...(Rows)>(plugin, rows...);
}

// The entry table with the option table published (ABI 1.2).
template <class Table>
constexpr ferry_plugin_v1_t with_options(ferry_plugin_v1_t t, const Table &table) {
    t.options = table.descs();
    t.n_options = static_cast<uint32_t>(table.size());
    t.option_desc_size = sizeof(ferry_option_desc_t);
    return t;
}

}  // namespace ferry_plugin
