// Whether this host has an EFA device, from sysfs alone: libfabric's initialisation (fi_getinfo
// loads every provider and reads /proc/kallsyms) costs ~0.3 s, which a host without EFA should
// not pay for a probe that can only say "no".
#pragma once

#include <string>

namespace ferry_efa {

// True when /sys/class/infiniband has a device bound to the efa driver (or with an EFA PCI id:
// vendor 0x1d0f, device 0xefa0-0xefa3). `where` names what was looked at, for the reason text.
bool efa_device_present(std::string *where);

}  // namespace ferry_efa
