// ferry-nixl-info: what a NIXL host sees of libplugin_FERRY.so. Lists the backend plugins NIXL
// finds (NIXL_PLUGIN_DIR or <dir of libnixl>/plugins), the FERRY backend's memory types and
// parameters, then creates a FERRY backend with the given key=value parameters.
// It says where things were found: NIXL's plugin directory, the libplugin_FERRY.so it loaded
// (Ferry's core is linked into it), the ferry/plugins directory of transports beside it, and
// which configuration came from parameters, the environment (FERRY_<KEY>) and FERRY_CONFIG, and
// the drop-in directory itself (the one holding libplugin_FERRY.so and ferry/plugins/).
// Exit status 0 when the backend was created, 1 when it was not found or failed to start.
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "nixl.h"

namespace {

const char *mem_name(nixl_mem_t m) {
    switch (m) {
        case DRAM_SEG: return "DRAM";
        case VRAM_SEG: return "VRAM";
        case BLK_SEG: return "BLK";
        case OBJ_SEG: return "OBJ";
        case FILE_SEG: return "FILE";
    }
    return "?";
}

void print_params(const nixl_mem_list_t &mems, const nixl_b_params_t &params) {
    printf("  memory:");
    for (auto m : mems) printf(" %s", mem_name(m));
    printf("\n");
    std::map<std::string, std::string> sorted(params.begin(), params.end());
    for (const auto &[k, v] : sorted) printf("  %-20s %s\n", k.c_str(), v.empty() ? "(unset)" : v.c_str());
}

// Where NIXL looks when NIXL_PLUGIN_DIR is unset: <dir of libnixl.so>/plugins.
std::string libnixl_path() {
    void *h = dlopen("libnixl.so", RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return "(libnixl.so not found)";
    link_map *map = nullptr;
    std::string path = dlinfo(h, RTLD_DI_LINKMAP, &map) == 0 && map ? map->l_name : "(unknown)";
    dlclose(h);
    return path;
}

}  // namespace

int main(int argc, char **argv) {
    nixl_b_params_t params;
    for (int i = 1; i < argc; ++i) {
        const char *eq = strchr(argv[i], '=');
        if (!eq || eq == argv[i]) {
            fprintf(stderr, "usage: %s [key=value ...]   (FERRY backend parameters, e.g. protocols=tcp)\n", argv[0]);
            return 2;
        }
        params[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = eq + 1;
    }
    const char *dir = getenv("NIXL_PLUGIN_DIR");
    printf("NIXL_PLUGIN_DIR: %s\n", dir ? dir : "(unset: NIXL looks in <dir of libnixl.so>/plugins)");
    printf("libnixl.so: %s\n", libnixl_path().c_str());

    nixlAgent agent("ferry-nixl-info", nixlAgentConfig(false));
    std::vector<nixl_backend_t> plugins;
    if (agent.getAvailPlugins(plugins) != NIXL_SUCCESS) {
        printf("NIXL could not list its backend plugins\n");
        return 1;
    }
    std::sort(plugins.begin(), plugins.end());
    printf("backend plugins:");
    for (const auto &p : plugins) printf(" %s", p.c_str());
    printf("\n");
    if (std::find(plugins.begin(), plugins.end(), "FERRY") == plugins.end()) {
        printf(
            "FERRY: not found; point NIXL_PLUGIN_DIR at Ferry's NIXL drop-in directory (<libdir>/ferry/nixl of an "
            "install; `python3 -m ferry_te.nixl` prints the wheel's) or copy its files into NIXL's "
            "(NIXL_LOG_LEVEL=DEBUG shows why a file was skipped)\n");
        return 1;
    }
    nixl_mem_list_t mems;
    nixl_b_params_t defaults;
    if (agent.getPluginParams("FERRY", mems, defaults) != NIXL_SUCCESS) {
        printf("FERRY: found, but NIXL could not load it (NIXL_LOG_LEVEL=DEBUG shows the loader's error)\n");
        return 1;
    }
    printf("FERRY: loaded; default parameters:\n");
    print_params(mems, defaults);

    nixlBackendH *backend = nullptr;
    if (agent.createBackend("FERRY", params, backend) != NIXL_SUCCESS) {
        printf("FERRY: creating the backend failed (the reason is in the log above)\n");
        return 1;
    }
    nixl_b_params_t used;
    agent.getBackendParams(backend, mems, used);
    printf("FERRY: backend created with:\n");
    print_params(mems, used);
    printf(
        "found:\n  plugin      %s/libplugin_FERRY.so (Ferry's core linked in)\n  transports  plugin_path, "
        "FERRY_PLUGIN_PATH, then %s\n  config      %s\n",
        used["note.plugin_dir"].c_str(), used["note.transport_dir"].c_str(), used["note.sources"].c_str());
    // The directory to hand to other NIXL hosts: it works by itself, copied or pointed at.
    printf("drop-in directory: %s\n  use it: NIXL_PLUGIN_DIR=%s, or cp -r %s/. <NIXL's plugin directory>/\n",
           used["note.plugin_dir"].c_str(), used["note.plugin_dir"].c_str(), used["note.plugin_dir"].c_str());
    return 0;
}
