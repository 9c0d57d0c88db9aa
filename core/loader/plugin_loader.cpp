#include "loader/plugin_loader.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include <boost/dll/runtime_symbol_info.hpp>

#include "loader/elf_check.hpp"
#include "util/log.hpp"
#include "util/report_json.hpp"

#ifndef FERRY_INSTALL_PLUGIN_DIR
#define FERRY_INSTALL_PLUGIN_DIR "/usr/local/lib/ferry/plugins"
#endif

namespace fs = std::filesystem;

namespace ferry {
namespace {

constexpr size_t kRequiredV1Size = FERRY_PLUGIN_V1_SIZE_UNTIL(completion_fd);

std::vector<std::string> split(const std::string &text, char sep) {
    std::vector<std::string> out;
    std::string item;
    std::istringstream in(text);
    while (std::getline(in, item, sep)) {
        auto b = item.find_first_not_of(" \t");
        auto e = item.find_last_not_of(" \t");
        if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    }
    return out;
}

std::string abi_text(uint32_t v) { return cat(v >> 16, ".", v & 0xffff); }

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
std::string ms_text(double ms) {
    char buf[32];
    snprintf(buf, sizeof buf, "%.2f ms", ms);
    return buf;
}

std::vector<std::string> plugin_files(const fs::path &dir) {
    std::vector<std::string> files;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const auto &p = it->path();
        if (p.extension() == ".so" && it->is_regular_file(ec)) files.push_back(p.string());
    }
    std::sort(files.begin(), files.end());
    return files;
}

// Variant subdirectories of `dir`, the ones an installed runtime serves first (in
// variant_priority order: newest CUDA, the chosen ROCm), then the rest.
std::vector<std::pair<std::string, bool>> variant_dirs(const fs::path &dir, const InstalledRuntimes &rt,
                                                       std::map<std::string, std::string> &why) {
    std::vector<std::pair<int, std::string>> matching;
    std::vector<std::string> others;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (!it->is_directory(ec)) continue;
        std::string name = it->path().filename().string();
        std::string family, reason;
        int major = 0;
        if (!parse_variant(name, family, major)) continue;
        if (variant_matches(rt, name, reason)) matching.emplace_back(variant_priority(rt, name), name);
        else others.push_back(name);
        why[name] = reason;
    }
    std::sort(matching.begin(), matching.end(), std::greater<>());
    std::sort(others.begin(), others.end());
    std::vector<std::pair<std::string, bool>> out;
    for (auto &[major, name] : matching) out.emplace_back(name, true);
    for (auto &name : others) out.emplace_back(name, false);
    return out;
}

constexpr size_t kOptionsV1Size = FERRY_PLUGIN_V1_SIZE_UNTIL(option_desc_size);
constexpr size_t kOptionDescSize = FERRY_OPTION_DESC_SIZE_UNTIL(help);
constexpr uint32_t kMaxOptions = 1024;

// A plugin's string, bounded: a table pointing at garbage must not make ferry-info read forever.
std::string bounded(const char *s) { return s ? std::string(s, strnlen(s, 4096)) : std::string(); }

// Copies the plugin's option table (ABI 1.2) into the record; a plugin built against an older
// plugin.h has none, and a malformed table is noted, not fatal: the plugin still loads.
void copy_options(const ferry_plugin_v1_t *api, PluginRecord &record) {
    if (api->struct_size < kOptionsV1Size || (api->options == nullptr && api->n_options == 0)) {
        record.options_note = cat("publishes no option table (plugin ABI ", abi_text(api->abi_version),
                                  "; tables came with ABI 1.2): its documentation lists its options");
        return;
    }
    if (api->options == nullptr || api->n_options > kMaxOptions || api->option_desc_size < kOptionDescSize) {
        record.options_note =
            cat("option table ignored: ", api->n_options, " entries of ", api->option_desc_size, " bytes at ",
                api->options == nullptr ? "NULL" : "an address", " (needs a pointer, at most ", kMaxOptions,
                " entries, each at least ", kOptionDescSize, " bytes); fix the plugin's ferry_plugin_v1 table");
        return;
    }
    const auto *base = reinterpret_cast<const char *>(api->options);
    for (uint32_t i = 0; i < api->n_options; ++i) {
        ferry_option_desc_t d{};
        memcpy(&d, base + static_cast<size_t>(i) * api->option_desc_size,
               std::min<size_t>(api->option_desc_size, sizeof d));
        if (d.name == nullptr || *d.name == '\0') {
            record.options.clear();
            record.options_note = cat("option table ignored: entry ", i, " has no name; fix the plugin's table");
            return;
        }
        record.options.push_back({bounded(d.name), d.type, bounded(d.default_text), d.min, d.max, bounded(d.values),
                                  bounded(d.accepted), bounded(d.help)});
    }
}

}  // namespace

const char *to_string(PluginState state) {
    switch (state) {
        case PluginState::Loaded: return "loaded";
        case PluginState::Unavailable: return "unavailable";
        case PluginState::Failed: return "failed";
        case PluginState::Excluded: return "excluded";
        case PluginState::Shadowed: return "shadowed";
        case PluginState::VariantSkipped: return "variant-skipped";
        case PluginState::Untrusted: return "untrusted";
    }
    return "unknown";
}

PluginSelection PluginSelection::parse(const std::string &text) {
    PluginSelection s;
    s.text = text;
    std::string body = text;
    if (!body.empty() && body[0] == '^') {
        s.negate = true;
        body = body.substr(1);
    }
    for (auto &n : split(body, ',')) s.names.insert(n);
    return s;
}

bool PluginSelection::allows(const std::string &name) const {
    if (names.empty()) return true;
    return negate ? names.count(name) == 0 : names.count(name) != 0;
}

const PluginRecord *PluginReport::find(const std::string &name) const {
    const PluginRecord *first = nullptr;
    for (const auto &p : plugins) {
        if (p.name != name) continue;
        if (p.state == PluginState::Loaded) return &p;
        if (!first) first = &p;
    }
    return first;
}

std::vector<std::string> default_search_path(const std::vector<std::string> &extra) {
    std::vector<std::string> path = extra;
    if (const char *env = std::getenv("FERRY_PLUGIN_PATH"))
        for (auto &p : split(env, ':')) path.push_back(p);
    boost::system::error_code ec;
    auto self = boost::dll::this_line_location(ec);
    if (!ec) path.push_back((fs::path(self.parent_path().string()) / "ferry" / "plugins").string());
    path.push_back(FERRY_INSTALL_PLUGIN_DIR);
    std::vector<std::string> unique;
    for (auto &p : path) {
        std::error_code fec;
        auto canonical = fs::weakly_canonical(p, fec);
        std::string key = fec ? p : canonical.string();
        if (std::find(unique.begin(), unique.end(), key) == unique.end()) unique.push_back(key);
    }
    return unique;
}

bool load_plugin_file(const std::string &path, const std::string &name, PluginRecord &record, TrustLevel trust) {
    auto fail_with = [&](std::string reason) {
        record.state = PluginState::Failed;
        record.reason = std::move(reason);
        return false;
    };
    // Checked and loaded through one descriptor: what is checked is what is loaded.
    auto file = open_checked(path, trust, Secrecy::Public);
    if (!file) return fail_with(cat("cannot open ", path, ": ", file.error().message));
    if (!file->problems.empty()) {
        if (trust != TrustLevel::Any) {
            record.state = PluginState::Untrusted;
            record.reason = cat("skipped: ", problems_text(file->problems),
                                trust == TrustLevel::Strict ? ", or set plugin_trust=owner or any to load it"
                                                            : ", or set plugin_trust=any to load it anyway");
            return false;
        }
        record.trust_note = cat("loaded despite: ", problems_text(file->problems), " (plugin_trust=any)");
    }
    // dlopen dies of SIGBUS on a truncated file and calls a foreign architecture "No such file".
    if (auto problem = check_elf_fd(file->fd.get()); !problem.empty())
        return fail_with(cat(fs::path(path).filename().string(), ": ", problem));
    auto library = SharedLibrary::load_fd(file->fd.get(), path);
    if (!library) return fail_with(library.error().message);

    const auto *api = static_cast<const ferry_plugin_v1_t *>(library->symbol(FERRY_PLUGIN_SYMBOL_V1));
    if (!api) {
        for (int major = 9; major >= 2; --major) {
            std::string sym = cat("ferry_plugin_v", major);
            if (library->symbol(sym.c_str()))
                return fail_with(cat("exports ", sym, " (plugin ABI ", major, ") but this Ferry loads ABI ",
                                     FERRY_PLUGIN_ABI_MAJOR, "; use a Ferry that supports ABI ", major,
                                     " or rebuild the plugin against this Ferry's plugin.h"));
        }
        return fail_with(
            cat("no symbol ", FERRY_PLUGIN_SYMBOL_V1, ": not a Ferry plugin, or built without exporting it"));
    }
    record.abi_version = api->abi_version;
    uint32_t major = api->abi_version >> 16;
    if (major != FERRY_PLUGIN_ABI_MAJOR)
        return fail_with(cat("plugin ABI ", abi_text(api->abi_version), " but this Ferry implements ABI ",
                             abi_text(FERRY_PLUGIN_ABI_VERSION), "; rebuild the plugin against this Ferry's plugin.h"));
    if (api->struct_size < kRequiredV1Size)
        return fail_with(cat("plugin struct is ", api->struct_size, " bytes but ABI ",
                             abi_text(FERRY_PLUGIN_ABI_VERSION), " needs at least ", kRequiredV1Size,
                             "; the plugin was built against a broken plugin.h"));
    if (!api->name || !api->version) return fail_with("plugin struct has no name or version string");
    record.version = api->version;
    record.caps = api->caps;
    if (name != api->name)
        return fail_with(cat("file is named ", name, ".so but the plugin calls itself '", api->name,
                             "'; rename the file to ", api->name, ".so"));
    if (!api->probe || !api->create || !api->destroy || !api->export_endpoint || !api->register_mem ||
        !api->deregister_mem || !api->export_mem || !api->connect || !api->disconnect || !api->import_mem ||
        !api->release_mem || !api->submit || !api->poll)
        return fail_with("plugin struct leaves a required function pointer NULL");

    copy_options(api, record);

    auto loaded = std::make_shared<LoadedPlugin>();
    loaded->library = std::move(*library);
    loaded->api = api;
    loaded->name = name;
    loaded->path = path;
    record.plugin = std::move(loaded);
    record.state = PluginState::Loaded;
    return true;
}

PluginReport load_plugins(const LoaderOptions &options) {
    auto start = Clock::now();
    PluginReport report;
    report.search_path = options.search_path;
    report.trust = options.trust;
    report.runtimes = probe_installed_runtimes();
    report.runtimes_ms = ms_since(start);
    std::map<std::string, std::string> winner;  // plugin name -> path of the copy used

    auto timed_load = [&options](const std::string &file, PluginRecord &rec) {
        auto load_start = Clock::now();
        bool ok = load_plugin_file(file, rec.name, rec, options.trust);
        // An untrusted file was never loaded: no load time to report.
        if (rec.state != PluginState::Untrusted) rec.load_ms = ms_since(load_start);
        return ok;
    };
    auto consider = [&](const std::string &file, const std::string &variant, bool variant_ok,
                        const std::string &variant_why) {
        PluginRecord rec;
        rec.path = file;
        rec.name = fs::path(file).stem().string();
        rec.variant = variant;
        if (!options.selection.allows(rec.name)) {
            rec.state = PluginState::Excluded;
            rec.reason = "left out by FERRY_PLUGINS=" + options.selection.text;
        } else if (!variant.empty() && !variant_ok) {
            rec.state = PluginState::VariantSkipped;
            rec.reason = variant + "/: " + variant_why;
        } else if (auto w = winner.find(rec.name); w != winner.end()) {
            rec.state = PluginState::Shadowed;
            rec.reason = "shadowed by " + w->second;
        } else if (timed_load(file, rec)) {
            winner[rec.name] = file;
            ferry_probe_result_t probe{};
            std::vector<ferry_kv_t> kv;
            if (auto it = options.plugin_options.find(rec.name); it != options.plugin_options.end())
                for (auto &[k, v] : it->second) kv.push_back({k.c_str(), v.c_str()});
            auto probe_start = Clock::now();
            int rc = rec.plugin->api->probe(kv.data(), kv.size(), &probe);
            rec.probe_ms = ms_since(probe_start);
            probe.reason[sizeof probe.reason - 1] = '\0';
            if (rc != 0) {
                rec.state = PluginState::Unavailable;
                rec.reason = cat("probe failed (", rc, "): ", probe.reason);
            } else {
                rec.state = probe.available ? PluginState::Loaded : PluginState::Unavailable;
                rec.reason = probe.reason;
            }
            if (rec.state == PluginState::Unavailable) rec.plugin.reset();
        } else {
            // A failed or untrusted copy does not shadow a later good one of the same name.
        }
        report.plugins.push_back(std::move(rec));
    };

    for (const auto &dir : options.search_path) {
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) continue;
        std::map<std::string, std::string> why;
        for (auto &[variant, ok] : variant_dirs(dir, report.runtimes, why))
            for (auto &file : plugin_files(fs::path(dir) / variant)) consider(file, variant, ok, why[variant]);
        for (auto &file : plugin_files(dir)) consider(file, "", true, "");
    }

    for (const auto &rec : report.plugins) {
        bool asked = options.selection.requested(rec.name);
        if (rec.state == PluginState::Loaded || rec.state == PluginState::Shadowed) continue;
        if (asked) {
            bool other_copy_loaded = std::any_of(
                report.plugins.begin(), report.plugins.end(),
                [&](const PluginRecord &r) { return r.name == rec.name && r.state == PluginState::Loaded; });
            if (other_copy_loaded) continue;
            report.errors.push_back(cat("plugin '", rec.name, "' (", rec.path, ") was requested but is ",
                                        to_string(rec.state), ": ", rec.reason));
        } else {
            FERRY_DEBUG("plugin ", rec.name, " (", rec.path, ") ", to_string(rec.state), ": ", rec.reason);
        }
    }
    for (const auto &name : options.selection.names) {
        if (options.selection.negate) break;
        bool found = std::any_of(report.plugins.begin(), report.plugins.end(),
                                 [&](const PluginRecord &r) { return r.name == name; });
        if (!found) {
            std::string dirs;
            for (auto &d : options.search_path) dirs += (dirs.empty() ? "" : ":") + d;
            report.errors.push_back(cat("plugin '", name, "' was requested but no ", name,
                                        ".so exists on the plugin search path (", dirs,
                                        "); install it or set FERRY_PLUGIN_PATH"));
        }
    }
    report.total_ms = ms_since(start);
    return report;
}

std::string PluginReport::to_text() const {
    std::ostringstream out;
    out << "Plugin search path (first match wins):\n";
    for (const auto &d : search_path) {
        std::error_code ec;
        out << "  " << d << (fs::is_directory(d, ec) ? "" : "  (missing)") << "\n";
    }
    out << "Plugin trust: " << describe(trust) << "\n";
    out << "Runtimes:\n";
    out << "  CUDA: " << (runtimes.cuda_major ? cat("major ", *runtimes.cuda_major, " — ") : "none — ")
        << runtimes.cuda_detail << "\n";
    out << "  ROCm: " << (runtimes.rocm_major ? cat("major ", *runtimes.rocm_major, " — ") : "none — ")
        << runtimes.rocm_detail << (runtimes.rocm_source.empty() ? "" : " (" + runtimes.rocm_source + ")") << "\n";
    for (const auto &[major, path] : runtimes.hip_libraries)
        out << "    libamdhip64.so." << major << ": " << path << "\n";
    out << "    variant: " << (runtimes.rocm_variant ? cat("rocm", *runtimes.rocm_variant, " — ") : "none — ")
        << runtimes.rocm_choice << "\n";
    out << "Plugins:\n";
    if (plugins.empty()) out << "  (no plugin files found)\n";
    for (const auto &p : plugins) {
        out << "  " << p.name << "  [" << to_string(p.state) << "]  " << p.path << "\n";
        if (p.abi_version) out << "      abi " << abi_text(p.abi_version) << ", version " << p.version << "\n";
        if (p.caps & FERRY_CAP_STORAGE)
            out << "      storage: file:<path> segments of this engine (no peer reaches it)\n";
        if (p.load_ms > 0) out << "      load " << ms_text(p.load_ms) << ", probe " << ms_text(p.probe_ms) << "\n";
        if (!p.reason.empty()) out << "      " << p.reason << "\n";
        if (!p.trust_note.empty()) out << "      " << p.trust_note << "\n";
    }
    out << "Discovery: " << ms_text(total_ms) << " (runtimes " << ms_text(runtimes_ms) << ")\n";
    if (!errors.empty()) {
        out << "Errors:\n";
        for (const auto &e : errors) out << "  " << e << "\n";
    }
    return out.str();
}

std::string PluginReport::to_json() const {
    ReportJson hip = ReportJson::object();
    for (const auto &[major, path] : runtimes.hip_libraries) hip[cat(major)] = path;
    ReportJson records = ReportJson::array();
    for (const auto &p : plugins)
        records.push_back({{"name", p.name},
                           {"path", p.path},
                           {"variant", p.variant},
                           {"state", to_string(p.state)},
                           {"loaded", p.state == PluginState::Loaded},
                           {"abi", p.abi_version ? abi_text(p.abi_version) : std::string()},
                           {"version", p.version},
                           {"caps", p.caps},
                           {"reason", p.reason},
                           {"trust_note", p.trust_note},
                           {"load_ms", report_number(p.load_ms)},
                           {"probe_ms", report_number(p.probe_ms)}});
    auto or_null = [](const std::optional<int> &v) { return v ? ReportJson(*v) : ReportJson(nullptr); };
    ReportJson j = {
        {"search_path", search_path},
        {"plugin_trust", to_string(trust)},
        {"runtimes",
         {{"cuda_major", or_null(runtimes.cuda_major)},
          {"cuda_detail", runtimes.cuda_detail},
          {"rocm_major", or_null(runtimes.rocm_major)},
          {"rocm_detail", runtimes.rocm_detail},
          {"rocm_source", runtimes.rocm_source},
          {"hip_libraries", std::move(hip)},
          {"rocm_variant",
           runtimes.rocm_variant ? ReportJson(cat("rocm", *runtimes.rocm_variant)) : ReportJson(nullptr)},
          {"rocm_choice", runtimes.rocm_choice}}},
        {"plugins", std::move(records)},
        {"errors", errors},
        {"runtimes_ms", report_number(runtimes_ms)},
        {"discovery_ms", report_number(total_ms)},
    };
    return report_text(j);
}

}  // namespace ferry
