// Test main: runs GoogleTest, or, when re-executed with --ferry-transport-peer, a transport
// peer for the cross-process tests (peer_process.hpp).
#include "peer_process.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <cstring>

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], ferry_test::kPeerFlag) == 0) return ferry_test::peer_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);  // raw-socket tests write to connections the plugin closes
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
