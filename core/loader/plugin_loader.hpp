// core/loader/: code found and loaded from files: transport plugins (this file), their ELF
// headers checked first (elf_check.hpp), the GPU runtimes installed (runtime_probe.hpp), where the
// dynamic loader would find a library (library_path.hpp), and shared objects opened from a checked
// descriptor (shared_library.hpp).
// May include: util/
//
// Finds transport plugins on the search path, checks that no other user could have written them
// (file_trust.hpp), loads them from the checked descriptor (RTLD_NOW | RTLD_LOCAL), checks their
// ABI, probes them, and records for every file found exactly what happened and why, for the
// engine and for ferry-info.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ferry/plugin.h"
#include "loader/runtime_probe.hpp"
#include "loader/shared_library.hpp"
#include "util/file_trust.hpp"

namespace ferry {

// A loaded plugin; the library stays mapped while any copy of this lives.
struct LoadedPlugin {
    SharedLibrary library;
    const ferry_plugin_v1_t *api = nullptr;
    std::string name;
    std::string path;
};

enum class PluginState {
    Loaded,          // usable: ABI accepted and probe says available
    Unavailable,     // loaded, but its probe says this host lacks the driver or device
    Failed,          // could not be loaded: dlopen error, missing symbol, ABI mismatch
    Excluded,        // not loaded: FERRY_PLUGINS (or the `plugins` key) leaves it out
    Shadowed,        // not loaded: a plugin of the same name earlier on the path wins
    VariantSkipped,  // not loaded: its variant directory's runtime is not installed
    Untrusted,       // not loaded: another user could have written it (plugin_trust)
};
const char *to_string(PluginState state);

// One entry of the option table a plugin publishes (ferry_plugin_v1_t.options, ABI 1.2), copied
// out of the plugin so it outlives an unavailable plugin's unloading.
struct PluginOption {
    std::string name;
    uint32_t type = FERRY_OPTION_STRING;  // ferry_option_type_t
    std::string default_text;
    uint64_t min = 0, max = 0;
    std::string values;    // ENUM: words separated by '|'
    std::string accepted;  // may be empty
    std::string help;
};

struct PluginRecord {
    std::string name;  // from the file name: tcp.so -> "tcp"
    std::string path;
    std::string variant;  // "" or the variant directory, e.g. "cuda13"
    PluginState state = PluginState::Failed;
    std::string reason;  // the exact reason, e.g. the dynamic loader's text
    // plugin_trust=any only: what the check found, "loaded despite: ..." ("" when nothing).
    std::string trust_note;
    uint32_t abi_version = 0;
    std::string version;
    uint64_t caps = 0;
    std::vector<PluginOption> options;     // the plugin's option table (ABI 1.2), when it publishes one
    std::string options_note;              // why there is none: ABI < 1.2, or what is wrong with it
    std::shared_ptr<LoadedPlugin> plugin;  // set when Loaded
    double load_ms = 0;                    // dlopen and ABI checks (0 when never loaded)
    double probe_ms = 0;                   // the plugin's probe (0 when never probed)
};

// FERRY_PLUGINS syntax: "tcp,shm" allows only those; "^efa,rdma" allows all but those.
struct PluginSelection {
    bool negate = false;
    std::set<std::string> names;
    std::string text;

    static PluginSelection parse(const std::string &text);
    bool allows(const std::string &name) const;
    // Named explicitly in an allow list: failing to load it is an error, not a debug line.
    bool requested(const std::string &name) const { return !negate && names.count(name) != 0; }
};

struct LoaderOptions {
    std::vector<std::string> search_path;
    PluginSelection selection;
    TrustLevel trust = kDefaultTrust;
    // Options passed to each plugin's probe, by plugin name.
    std::map<std::string, std::vector<std::pair<std::string, std::string>>> plugin_options;
};

struct PluginReport {
    std::vector<std::string> search_path;
    TrustLevel trust = kDefaultTrust;
    InstalledRuntimes runtimes;
    std::vector<PluginRecord> plugins;
    // Problems with plugins the user asked for by name; non-empty means "fail loudly".
    std::vector<std::string> errors;
    double runtimes_ms = 0;  // probe_installed_runtimes
    double total_ms = 0;     // all of load_plugins

    const PluginRecord *find(const std::string &name) const;
    std::string to_text() const;
    std::string to_json() const;
};

// FERRY_PLUGIN_PATH entries, then <dir of libferry>/ferry/plugins, then the install dir;
// `extra` (the engine's plugin_path key) goes first. Duplicates removed.
std::vector<std::string> default_search_path(const std::vector<std::string> &extra = {});

PluginReport load_plugins(const LoaderOptions &options);

// load_plugins over an engine config's plugin_path, plugins, plugin_trust and <plugin>.<key>
// (probe options), as ferry-info sees them (describe_plugins.cpp).
PluginReport discover_plugins(const std::map<std::string, std::string> &config);

// Checks, loads and validates one file (no search, no probe). Used by load_plugins and tests.
bool load_plugin_file(const std::string &path, const std::string &name, PluginRecord &record,
                      TrustLevel trust = kDefaultTrust);

}  // namespace ferry
