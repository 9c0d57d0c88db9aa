#include <cstdlib>

#include "engine/config.hpp"
#include "ferry/engine.hpp"
#include "loader/plugin_loader.hpp"
#include "util/log.hpp"

namespace ferry {

PluginReport discover_plugins(const Config &config) {
    LoaderOptions options;
    std::vector<std::string> extra;
    std::string selection;
    if (auto it = config.find("plugin_path"); it != config.end()) extra = split_list(it->second, ':');
    if (auto it = config.find("plugins"); it != config.end()) selection = it->second;
    else if (const char *env = std::getenv("FERRY_PLUGINS")) selection = env;
    options.search_path = default_search_path(extra);
    options.selection = PluginSelection::parse(selection);
    const std::string *trust_key = nullptr;
    if (auto it = config.find("plugin_trust"); it != config.end()) trust_key = &it->second;
    auto trust = resolve_plugin_trust(trust_key);
    if (trust) options.trust = *trust;
    for (const auto &[key, value] : config)
        if (auto dot = key.find('.'); dot != std::string::npos && dot > 0)
            options.plugin_options[key.substr(0, dot)].emplace_back(key.substr(dot + 1), value);
    auto report = load_plugins(options);
    // A level that is not one: say so (ferry-info exits 1) over what the default finds.
    if (!trust) report.errors.push_back(trust.error().message);
    // Nothing to load is an error for ferry-info (exit 1) too: say where it looked and what to set.
    if (report.plugins.empty()) {
        std::string dirs;
        for (auto &d : options.search_path) dirs += (dirs.empty() ? "" : ":") + d;
        report.errors.push_back(cat("no plugin files (<name>.so) in any directory of the search path (", dirs,
                                    "); build them (ninja -C build: they appear in build/core/ferry/plugins/), "
                                    "or set FERRY_PLUGIN_PATH (a colon list) or plugin_path to the directories "
                                    "that hold them"));
    }
    return report;
}

PluginReportOutput describe_plugins(const Config &config) {
    auto report = discover_plugins(config);
    return {report.to_text(), report.to_json(), report.errors.empty()};
}

}  // namespace ferry
