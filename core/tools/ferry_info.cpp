// core/tools/: ferry-info (this file, built as build/core/ferry-info, linked to libferry's public
// API only) and what it prints, which libferry exports for it (describe_plugins.cpp,
// describe_options.cpp: ferry::describe_* in include/ferry/engine.hpp).
// May include: engine/, metadata/, control/, staging/, metrics/, loader/, util/
//
// ferry-info: which transport plugins exist, which loaded, and exactly why the others did not.
#include <cstdio>
#include <cstring>
#include <string>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"

int main(int argc, char **argv) {
    bool json = false, markdown = false, options = false;
    std::string only;
    ferry::Config config;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--markdown")) {
            markdown = true;
        } else if (!strcmp(argv[i], "--options")) {
            options = true;
            if (i + 1 < argc && argv[i + 1][0] != '-') only = argv[++i];
        } else if (!strcmp(argv[i], "--plugin-path") && i + 1 < argc) {
            config["plugin_path"] = argv[++i];
        } else if (!strcmp(argv[i], "--plugins") && i + 1 < argc) {
            config["plugins"] = argv[++i];
        } else if (!strcmp(argv[i], "--plugin-trust") && i + 1 < argc) {
            config["plugin_trust"] = argv[++i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf(
                "usage: ferry-info [--json] [--plugin-path DIR[:DIR...]] [--plugins LIST]\n"
                "                  [--plugin-trust strict|owner|any]\n"
                "       ferry-info --options [PLUGIN|engine] [--json|--markdown] [--plugin-path ...]\n"
                "Lists the plugin search path and every plugin found: ABI, version, probe result, and why\n"
                "any plugin did not load. Exits 1 when a plugin named in FERRY_PLUGINS (or --plugins) is\n"
                "missing or unavailable.\n"
                "--options prints every option of every loaded plugin (or of PLUGIN, or the engine's own\n"
                "keys) with its default, what it accepts and what it does, from the tables the plugins\n"
                "publish; --markdown prints the rows of docs/OPTIONS.md. Exits 1 when PLUGIN is not loaded.\n"
                "A plugin file another user could have written (it, or a directory above it) is skipped\n"
                "and says why and what fixes it, unless --plugin-trust any (docs/DESIGN.md, \"What the\n"
                "loader trusts\").\n"
                "Environment: FERRY_PLUGIN_PATH (directories searched first), FERRY_PLUGINS (tcp,shm or ^efa),\n"
                "FERRY_PLUGIN_TRUST (strict, owner or any; default owner).\n");
            return 0;
        } else {
            fprintf(stderr, "ferry-info: unknown argument '%s'; see ferry-info --help\n", argv[i]);
            return 2;
        }
    }
    if (options) {
        auto out = ferry::describe_options(config, only, json ? "json" : markdown ? "markdown" : "text");
        fputs(out.text.c_str(), out.ok ? stdout : stderr);
        return out.ok ? 0 : 1;
    }
    if (markdown) {
        fprintf(stderr, "ferry-info: --markdown goes with --options; see ferry-info --help\n");
        return 2;
    }
    auto report = ferry::describe_plugins(config);
    if (json) {
        printf("%s\n", report.json.c_str());
    } else {
        printf("Ferry %s\n%s", ferry_version(), report.text.c_str());
    }
    return report.requested_ok ? 0 : 1;
}
