// The six libfabric functions efa.so calls, opened at run time: loading libfabric.so.1 costs
// ~0.2 s before any call (its psm/infinipath dependencies calibrate a clock in their
// constructors: ~950 sleeps of 125 us), which a host without an EFA device must not pay just to be
// told "no". Each is bound to the symbol version the build's libfabric had as default
// (fabric_versions.py), exactly what linking would have bound. Builds without that information
// link libfabric and call it directly (FERRY_EFA_LINKED_FABRIC).
#pragma once

#include <rdma/fabric.h>

#include <string>

namespace ferry_efa::fabric {

// Opens libfabric once; false with the loader's words in `why` (may be null) when it cannot.
// The functions below may be called only after it returned true.
bool load(std::string *why);

int getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const fi_info *hints,
            fi_info **info);
void freeinfo(fi_info *info);
fi_info *dupinfo(const fi_info *info);
int open_fabric(fi_fabric_attr *attr, fid_fabric **fabric, void *context);
const char *strerror(int code);
uint32_t version();

}  // namespace ferry_efa::fabric

namespace ferry_efa {
// fi_strerror() of a libfabric return code (negative or positive); strerror() while libfabric
// cannot be loaded.
std::string fi_error_string(int code);
}  // namespace ferry_efa
