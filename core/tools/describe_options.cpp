// `ferry-info --options [plugin]`: every option of every plugin (the tables plugins publish,
// ABI 1.2) and the engine's own keys, with default, what is accepted and help, as text, JSON or
// the Markdown rows docs/OPTIONS.md carries (tests/readme_options_test.py checks them).
#include <sstream>

#include "engine/config.hpp"
#include "ferry/engine.hpp"
#include "loader/plugin_loader.hpp"
#include "util/log.hpp"
#include "util/report_json.hpp"

namespace ferry {
namespace {

std::string size_word(uint64_t v) {
    if (v != 0 && v % (1ull << 30) == 0) return cat(v >> 30, "g");
    if (v != 0 && v % (1ull << 20) == 0) return cat(v >> 20, "m");
    if (v != 0 && v % (1ull << 10) == 0) return cat(v >> 10, "k");
    return cat(v);
}

// What passes: the plugin's words when it gave them, else its type and range in short.
std::string accepted(const PluginOption &o) {
    if (!o.accepted.empty()) return o.accepted;
    bool open = o.max == UINT64_MAX;
    switch (o.type) {
        case FERRY_OPTION_UINT: return open ? cat(">= ", o.min) : cat(o.min, "..", o.max);
        case FERRY_OPTION_SIZE:
            return (open ? ">= " + size_word(o.min) : size_word(o.min) + ".." + size_word(o.max)) + " bytes";
        case FERRY_OPTION_DURATION_MS: return (open ? cat(">= ", o.min) : cat(o.min, "..", o.max)) + " ms";
        case FERRY_OPTION_BOOL: return "true or false";
        case FERRY_OPTION_ENUM: {
            std::string out = o.values;
            for (size_t bar; (bar = out.find('|')) != std::string::npos;) out.replace(bar, 1, ", ");
            return out;
        }
        case FERRY_OPTION_SECRET: return "a secret (never printed)";
    }
    return "text";
}

// The records whose options can be shown: the copy of each name that was loaded (available or
// not), in search-path order.
std::vector<const PluginRecord *> shown_plugins(const PluginReport &report) {
    std::vector<const PluginRecord *> out;
    for (const auto &p : report.plugins) {
        if (p.state != PluginState::Loaded && p.state != PluginState::Unavailable) continue;
        bool seen = false;
        for (auto *q : out) seen |= q->name == p.name;
        if (!seen) out.push_back(&p);
    }
    return out;
}

std::string md_cell(std::string s) {
    for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.replace(i, 1, "\\|");
    return s;
}
std::string md_default(const std::string &d) {
    if (d.empty()) return "";
    return d.find(' ') == std::string::npos ? "`" + d + "`" : md_cell(d);
}

void text_plugin(std::ostringstream &out, const PluginRecord &p) {
    out << p.name << " (" << p.path << ", abi " << (p.abi_version >> 16) << "." << (p.abi_version & 0xffff)
        << "): set as " << p.name << ".<option>\n";
    if (p.options.empty()) out << "  " << p.options_note << "\n";
    for (const auto &o : p.options) {
        out << "  " << o.name << " = " << (o.default_text.empty() ? "(none)" : o.default_text) << "\n";
        out << "      " << ferry_option_type_name(o.type) << ": " << accepted(o) << "\n";
        if (!o.help.empty()) out << "      " << o.help << "\n";
    }
}

ReportJson json_plugin(const PluginRecord &p) {
    ReportJson options = ReportJson::array();
    for (const auto &o : p.options)
        options.push_back({{"name", o.name},
                           {"type", ferry_option_type_name(o.type)},
                           {"default", o.default_text},
                           {"min", o.min},
                           {"max", o.max},
                           {"values", o.values},
                           {"accepted", accepted(o)},
                           {"help", o.help}});
    return {{"name", p.name},
            {"path", p.path},
            {"abi", cat(p.abi_version >> 16, ".", p.abi_version & 0xffff)},
            {"note", p.options_note},
            {"options", std::move(options)}};
}

}  // namespace

OptionReportOutput describe_options(const Config &config, const std::string &only, const std::string &format) {
    OptionReportOutput result;
    const bool engine = only.empty() || only == "engine";
    PluginReport report;
    if (only != "engine") report = discover_plugins(config);
    std::vector<const PluginRecord *> plugins;
    for (auto *p : shown_plugins(report))
        if (only.empty() || p->name == only) plugins.push_back(p);
    if (!only.empty() && !engine && plugins.empty()) {
        std::string why = cat("no plugin named '", only, "' was loaded");
        if (const PluginRecord *r = report.find(only)) why += cat(" (", to_string(r->state), ": ", r->reason, ")");
        else why += "; `ferry-info` lists the plugins found and why any did not load";
        result.ok = false;
        result.text = "ferry-info: " + why + "\n";
        return result;
    }

    std::ostringstream out;
    if (format == "json") {
        ReportJson j = ReportJson::object();
        if (engine) {
            ReportJson keys = ReportJson::array();
            for (const auto &k : engine_keys())
                keys.push_back(
                    {{"name", k.key}, {"default", k.default_text}, {"accepted", k.accepted}, {"help", k.help}});
            j["engine"] = std::move(keys);
        }
        ReportJson shown = ReportJson::array();
        for (auto *p : plugins) shown.push_back(json_plugin(*p));
        j["plugins"] = std::move(shown);
        out << report_text(j) << "\n";
    } else if (format == "markdown") {
        // Generated rows for docs/OPTIONS.md: `ferry-info --options --markdown`.
        for (auto *p : plugins) {
            out << "\n" << p->name << ".so (`" << p->name << ".<option>`):\n\n";
            out << "| option | default | accepted | meaning |\n|---|---|---|---|\n";
            for (const auto &o : p->options)
                out << "| `" << p->name << "." << o.name << "` | " << md_default(o.default_text) << " | "
                    << md_cell(accepted(o)) << " | " << md_cell(o.help) << " |\n";
            if (p->options.empty()) out << "| | | | " << md_cell(p->options_note) << " |\n";
        }
    } else {
        if (engine) {
            out << "engine (keys of Engine::create, YAML files and --option):\n";
            for (const auto &k : engine_keys()) {
                out << "  " << k.key << " = " << (*k.default_text ? k.default_text : "(none)") << "\n";
                out << "      " << k.accepted << "\n      " << k.help << "\n";
            }
        }
        for (auto *p : plugins) {
            if (engine || p != plugins.front()) out << "\n";
            text_plugin(out, *p);
        }
        if (only.empty())
            for (const auto &p : report.plugins)
                if (p.state == PluginState::Failed || p.state == PluginState::VariantSkipped ||
                    p.state == PluginState::Untrusted)
                    out << "\n"
                        << p.name << " (" << p.path << "): not loaded (" << to_string(p.state)
                        << "), so its options cannot be read; `ferry-info` says why\n";
    }
    result.text = out.str();
    return result;
}

}  // namespace ferry
