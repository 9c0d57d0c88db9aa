// The value-parameterized transport conformance suite (conformance_test.cpp) and the helpers
// its tests share. Instantiations live in transport_params.cpp.
#pragma once

#include "harness.hpp"
#include "peer_process.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

namespace ferry_test {

class TransportConformance : public ::testing::TestWithParam<TransportParam> {
protected:
    void SetUp() override;
    // An instance with the parameter's options plus `extra`; nullptr (and a failure) if
    // create fails.
    std::unique_ptr<Instance> make(const Options &extra = {});
    void connect_import(Instance &from, const std::vector<uint8_t> &endpoint, uint64_t addr, uint64_t len,
                        uint32_t access, uint64_t *peer, uint64_t *remote_mem);

    std::unique_ptr<Plugin> plugin_;
};

// Exactly n completions, all successful, each user_data once.
void expect_all_ok(const std::vector<ferry_completion_t> &c, size_t n);

}  // namespace ferry_test
