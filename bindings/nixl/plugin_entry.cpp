// The two symbols a NIXL host looks up in libplugin_FERRY.so.
#include <ferry/ferry.h>

#include "backend/backend_plugin.h"
#include "backend_params.hpp"
#include "ferry_backend.hpp"

extern "C" NIXL_PLUGIN_EXPORT nixlBackendPlugin *nixl_plugin_init() {
    // The version NIXL reports is the Ferry library's this plugin runs against.
    return nixlBackendPluginCreator<ferry_nixl::nixlFerryEngine>::create(
        NIXL_PLUGIN_API_VERSION, "FERRY", ferry_version(), ferry_nixl::default_backend_params(), {DRAM_SEG, VRAM_SEG});
}

extern "C" NIXL_PLUGIN_EXPORT void nixl_plugin_fini() {}
