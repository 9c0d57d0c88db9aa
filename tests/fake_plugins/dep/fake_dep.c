/* A library the "missing dependency" fake plugin links against; the tests never put it on the
 * loader's path, so loading that plugin fails the way a missing libamdhip64.so.6 would. */
__attribute__((visibility("default"))) int ferry_fake_dep_value(void) { return 7; }
