// Which machine (kernel instance) this process runs on. Two processes may share memory only
// when their identities match: machine id plus boot id, never the hostname.
#pragma once

#include <string>

namespace ferry {

// "<machine-id>/<boot-id>"; FERRY_HOST_ID (or the engine's `host_id` key) overrides it, e.g.
// so network-namespace tests can act as separate hosts.
std::string local_host_identity();

}  // namespace ferry
