// Shared by the auth tests (auth_crypto_test, auth_control_test, auth_test): the cluster
// secrets they use and an engine made with extra config keys.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ferry/engine.hpp"

namespace ferry::test::auth {

inline const std::string kSecret = "correct horse battery staple 42";
inline const std::string kOtherSecret = "another cluster's secret, 1234";

inline bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

inline std::unique_ptr<ferry::Engine> engine_with(Config extra) {
    ferry::Config c{{"plugins", "tcp"}};
    for (auto &[k, v] : extra) c[k] = v;
    auto e = ferry::Engine::create(c);
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

}  // namespace ferry::test::auth
