// What every storage plugin (FERRY_CAP_STORAGE: file.so, gds.so) answers alike: it serves no
// peer, so it has no endpoint, no remote-access bytes for its regions and nothing to release
// for a file it "imported". A storage transport derives from this beside its own calls.
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>

namespace ferry_plugin {

struct StoragePeerless {
    int export_endpoint(void *, size_t *len, ferry_error_t *) {
        *len = 0;  // a storage plugin serves no peer
        return 0;
    }
    int export_mem(uint64_t, void *, size_t *len, ferry_error_t *) {
        *len = 0;
        return 0;
    }
    int release_mem(uint64_t, uint64_t, ferry_error_t *) { return 0; }
};

}  // namespace ferry_plugin
