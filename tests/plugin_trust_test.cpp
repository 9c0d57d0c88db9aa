// What the plugin loader trusts (core/util/file_trust.cpp): plugin files in real directories with real
// modes, owners and symlinks, a second local user made for the test, a file swapped while it is
// loaded, and what ferry-info and an engine say about each. As root (CI); the tests that need
// the second user print SKIPPED otherwise.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include "ferry/engine.hpp"
#include "loader/plugin_loader.hpp"
#include "test_util.hpp"
#include "trust_util.hpp"
#include "util/log.hpp"

using namespace ferry;
using ferry::test::give_to;
using ferry::test::other_user;
using ferry::test::set_mode;
using ferry::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string fake(const std::string &name) { return std::string(FERRY_FAKE_PLUGIN_DIR) + "/" + name + ".so"; }

PluginRecord load_one(const fs::path &dir, const std::string &name, TrustLevel trust) {
    LoaderOptions o;
    o.search_path = {dir.string()};
    o.trust = trust;
    for (auto &p : load_plugins(o).plugins)
        if (p.name == name) return std::move(p);
    ADD_FAILURE() << "no record for " << name << " in " << dir;
    return {};
}

std::string state(const PluginRecord &r) { return cat(to_string(r.state), ": ", r.reason); }
bool has(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// A directory outside /tmp (whose sticky bit plugin_trust=strict refuses), in the build tree.
fs::path scratch_dir() {
    fs::path base = FERRY_TRUST_SCRATCH_DIR;
    fs::create_directories(base);
    set_mode(base, 0755);
    std::string tmpl = (base / "XXXXXX").string();
    return mkdtemp(tmpl.data());
}

class PluginTrust : public ::testing::Test {
protected:
    // Copies a fake plugin to dir/<rel>, creating directories (0755) on the way, with `mode`.
    fs::path put(const std::string &built, const std::string &rel, mode_t mode = 0755) {
        fs::path to = dir / rel;
        test::copy_file(fake(built), to);
        set_mode(to, mode);
        return to;
    }
    // ferry-info as a user runs it, over a copy of libferry that has no ferry/plugins beside it.
    std::string ferry_info(const std::string &env, const std::string &args, int *status) {
        if (!fs::exists(lib / "libferry.so.0")) test::copy_file(FERRY_LIBFERRY_SO, lib / "libferry.so.0");
        return test::run_command("env -u FERRY_PLUGINS -u FERRY_PLUGIN_TRUST LD_LIBRARY_PATH=" + lib.path().string() +
                                     " " + env + " " + FERRY_INFO_BIN + " " + args + " 2>&1",
                                 status);
    }
    TempDir dir, lib;
};

}  // namespace

TEST_F(PluginTrust, AWorldWritableFileIsSkippedWithTheFixAndLoadsOnceFixed) {
    fs::path f = put("fake_good", "fake_good.so", 0666);
    auto r = load_one(dir.path(), "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Untrusted) << state(r);
    EXPECT_EQ(r.reason, "skipped: " + f.string() + " is writable by others (mode 0666); fix: chmod go-w " + f.string() +
                            ", or set plugin_trust=any to load it anyway");
    EXPECT_FALSE(r.plugin);
    EXPECT_EQ(r.load_ms, 0) << "never loaded";

    int status = -1;
    std::string text = ferry_info("FERRY_PLUGIN_PATH=" + dir.path().string(), "", &status);
    EXPECT_EQ(status, 0) << "nobody asked for it by name\n" << text;
    EXPECT_TRUE(has(text, "fake_good  [untrusted]  " + f.string() + "\n      " + r.reason)) << text;
    EXPECT_TRUE(has(text, "Plugin trust: owner: ")) << text;
    std::string json = ferry_info("FERRY_PLUGIN_PATH=" + dir.path().string(), "--json", &status);
    EXPECT_TRUE(has(json, "\"state\":\"untrusted\",\"loaded\":false")) << json;
    EXPECT_TRUE(has(json, "\"reason\":\"" + r.reason + "\"")) << json;
    EXPECT_TRUE(has(json, "\"plugin_trust\":\"owner\"")) << json;
    // Asked for by name, an untrusted plugin is an error.
    text = ferry_info("FERRY_PLUGIN_PATH=" + dir.path().string() + " FERRY_PLUGINS=fake_good", "", &status);
    EXPECT_EQ(status, 1) << text;
    EXPECT_TRUE(has(text, "plugin 'fake_good' (" + f.string() + ") was requested but is untrusted: skipped:")) << text;

    // plugin_trust=any loads it, and says what it would have refused.
    r = load_one(dir.path(), "fake_good", TrustLevel::Any);
    EXPECT_EQ(r.state, PluginState::Loaded) << state(r);
    EXPECT_EQ(r.trust_note, "loaded despite: " + f.string() + " is writable by others (mode 0666); fix: chmod go-w " +
                                f.string() + " (plugin_trust=any)");
    text = ferry_info("FERRY_PLUGIN_PATH=" + dir.path().string(), "--plugin-trust any", &status);
    EXPECT_TRUE(has(text, "fake_good  [loaded]  " + f.string())) << text;
    EXPECT_TRUE(has(text, "      " + r.trust_note + "\n")) << text;
    json = ferry_info("FERRY_PLUGIN_PATH=" + dir.path().string() + " FERRY_PLUGIN_TRUST=any", "--json", &status);
    EXPECT_TRUE(has(json, "\"trust_note\":\"" + r.trust_note + "\"")) << json;
    EXPECT_TRUE(has(json, "\"plugin_trust\":\"any\"")) << json;

    set_mode(f, 0644);  // the fix it named
    r = load_one(dir.path(), "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Loaded) << state(r);
    EXPECT_EQ(r.trust_note, "");
}

TEST_F(PluginTrust, AGroupWritableDirectoryThreeLevelsUpIsNamed) {
    fs::path f = put("fake_good", "a/b/c/fake_good.so");
    set_mode(dir / "a", 0775);
    auto r = load_one(dir / "a/b/c", "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Untrusted) << state(r);
    const std::string a = (dir / "a").string();
    EXPECT_EQ(r.reason, "skipped: " + a + " is writable by group (mode 0775); fix: chmod go-w " + a +
                            ", or set plugin_trust=any to load it anyway");
    int status = -1;
    std::string json = ferry_info("FERRY_PLUGIN_PATH=" + (dir / "a/b/c").string(), "--json", &status);
    EXPECT_TRUE(has(json, "\"reason\":\"" + r.reason + "\"")) << json;
    EXPECT_EQ(load_one(dir / "a/b/c", "fake_good", TrustLevel::Any).state, PluginState::Loaded);
    set_mode(dir / "a", 0755);
    EXPECT_EQ(load_one(dir / "a/b/c", "fake_good", TrustLevel::Owner).state, PluginState::Loaded);
}

TEST_F(PluginTrust, AFileOrADirectoryOwnedByAnotherUserIsSkipped) {
    REQUIRE_OTHER_USER();
    const auto &other = other_user();
    fs::path f = put("fake_good", "theirs/fake_good.so", 0644);
    give_to(f, other.uid(), other.gid());
    auto r = load_one(dir / "theirs", "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Untrusted) << state(r);
    EXPECT_EQ(r.reason, cat("skipped: ", f.string(), " is owned by uid ", other.uid(),
                            ", not root or this process's user (uid 0); fix: chown root ", f.string(),
                            ", or set plugin_trust=any to load it anyway"));
    int status = -1;
    std::string text = ferry_info("FERRY_PLUGIN_PATH=" + (dir / "theirs").string(), "", &status);
    EXPECT_TRUE(has(text, "fake_good  [untrusted]  " + f.string() + "\n      " + r.reason)) << text;
    EXPECT_EQ(load_one(dir / "theirs", "fake_good", TrustLevel::Any).state, PluginState::Loaded);

    // Our file in their directory: they could replace it.
    give_to(f, 0, 0);
    give_to(dir / "theirs", other.uid(), other.gid());
    r = load_one(dir / "theirs", "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Untrusted) << state(r);
    EXPECT_TRUE(has(r.reason, cat((dir / "theirs").string(), " is owned by uid ", other.uid()))) << r.reason;
}

// A sticky directory anyone can write (as /tmp): others cannot replace what they do not own
// there, so a root-owned directory in it is as safe as anywhere under owner, and an entry the
// other user owns is theirs to change. strict refuses the sticky directory itself.
TEST_F(PluginTrust, AStickyDirectoryHoldsSafeSubdirectoriesButNotOtherUsersEntries) {
    REQUIRE_OTHER_USER();
    const auto &other = other_user();
    fs::path shared = dir / "shared";
    fs::create_directories(shared);
    set_mode(shared, 01777);
    put("fake_good", "shared/safe/fake_good.so");
    auto r = load_one(shared / "safe", "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Loaded) << state(r);
    r = load_one(shared / "safe", "fake_good", TrustLevel::Strict);
    EXPECT_EQ(r.state, PluginState::Untrusted) << state(r);
    EXPECT_TRUE(has(r.reason, shared.string() +
                                  " is writable by others (mode 1777); the sticky bit is not enough under "
                                  "plugin_trust=strict; "))
        << r.reason;
    EXPECT_TRUE(has(r.reason, ", or set plugin_trust=owner or any to load it")) << r.reason;

    put("fake_good", "shared/theirs/fake_good.so");
    give_to(shared / "theirs", other.uid(), other.gid());
    r = load_one(shared / "theirs", "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Untrusted) << state(r);
    EXPECT_TRUE(has(r.reason, cat((shared / "theirs").string(), " is owned by uid ", other.uid()))) << r.reason;

    // Their symlink in the sticky directory, to a file we trust: they may point it elsewhere.
    fs::create_symlink(shared / "safe/fake_good.so", shared / "fake_good.so");
    give_to(shared / "fake_good.so", other.uid(), other.gid());
    r = load_one(shared, "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Untrusted) << state(r);
    EXPECT_TRUE(has(r.reason, cat((shared / "fake_good.so").string(), " is owned by uid ", other.uid()))) << r.reason;
    EXPECT_TRUE(has(r.reason, "fix: chown -h root " + (shared / "fake_good.so").string())) << r.reason;
    give_to(shared / "fake_good.so", 0, 0);
    EXPECT_EQ(load_one(shared, "fake_good", TrustLevel::Owner).state, PluginState::Loaded);
}

TEST_F(PluginTrust, ASymlinkIsResolvedAndItsTargetsDirectoriesChecked) {
    fs::path target = put("fake_good", "unsafe/fake_good.so", 0644);
    set_mode(dir / "unsafe", 0777);
    fs::create_directories(dir / "safe");
    // Relative, through .., passing the unsafe directory twice: it is named once.
    fs::create_symlink("../unsafe/../unsafe/fake_good.so", dir / "safe/fake_good.so");
    auto r = load_one(dir / "safe", "fake_good", TrustLevel::Owner);
    EXPECT_EQ(r.state, PluginState::Untrusted) << state(r);
    EXPECT_EQ(r.path, (dir / "safe/fake_good.so").string()) << "the record names the file as found";
    const std::string unsafe = (dir / "unsafe").string();
    EXPECT_EQ(r.reason, "skipped: " + unsafe + " is writable by others (mode 0777); fix: chmod go-w " + unsafe +
                            ", or set plugin_trust=any to load it anyway");
    int status = -1;
    std::string text = ferry_info("FERRY_PLUGIN_PATH=" + (dir / "safe").string(), "", &status);
    EXPECT_TRUE(has(text, "[untrusted]  " + (dir / "safe/fake_good.so").string() + "\n      " + r.reason)) << text;
    EXPECT_EQ(load_one(dir / "safe", "fake_good", TrustLevel::Any).state, PluginState::Loaded);
    // The same link to a safe place loads: as the build tree's core/ferry/plugins/ links do.
    set_mode(dir / "unsafe", 0755);
    EXPECT_EQ(load_one(dir / "safe", "fake_good", TrustLevel::Owner).state, PluginState::Loaded);
}

// A trusted and an untrusted build of one plugin take turns at its path while it is loaded over
// and over: every load either refuses or loads the trusted build (version "plain"), never the
// other ("cuda13"), because the file checked is the descriptor loaded.
TEST_F(PluginTrust, AFileSwappedBetweenCheckAndLoadIsNeverTheOneLoaded) {
    put("fake_gpu_plain", "trusted.bin", 0755);
    put("fake_gpu_cuda13", "untrusted.bin", 0666);
    const fs::path path = dir / "fake_gpu.so";
    fs::copy_file(dir / "trusted.bin", path);
    std::atomic<bool> stop{false};
    std::thread swapper([&] {
        for (unsigned i = 0; !stop; ++i) {
            fs::path from = dir / (i % 2 ? "untrusted.bin" : "trusted.bin");
            fs::path tmp = dir / ("next" + std::to_string(i % 2));
            ::link(from.c_str(), tmp.c_str());
            ::rename(tmp.c_str(), path.c_str());
        }
    });
    int trusted = 0, refused = 0, wrong = 0;
    for (int i = 0; i < 20000 && (i < 500 || trusted < 50 || refused < 50); ++i) {
        PluginRecord rec;
        rec.name = "fake_gpu";
        load_plugin_file(path.string(), "fake_gpu", rec, TrustLevel::Owner);
        if (rec.state == PluginState::Loaded && rec.plugin && std::string(rec.plugin->api->version) == "plain") {
            ++trusted;
        } else if (rec.state == PluginState::Untrusted && has(rec.reason, "is writable by others (mode 0666)")) {
            ++refused;
        } else {
            ++wrong;
            ADD_FAILURE() << "load " << i << ": " << state(rec) << " version " << rec.version;
            if (wrong > 5) break;
        }
    }
    stop = true;
    swapper.join();
    printf("swapped file: %d loads of the trusted build, %d refusals of the untrusted one\n", trusted, refused);
    EXPECT_EQ(wrong, 0);
    EXPECT_GT(trusted, 0) << "the swap never showed the trusted build: the test proved nothing";
    EXPECT_GT(refused, 0) << "the swap never showed the untrusted build: the test proved nothing";
}

// glibc knows loaded libraries by the names they were opened as: "/proc/self/fd/N" still names
// a library that stays loaded after N is closed and reused for another file.
TEST_F(PluginTrust, AReusedDescriptorNumberLoadsTheNewFileNotTheLibraryLoadedUnderIt) {
    put("fake_gpu_cuda12", "first.so");
    put("fake_gpu_cuda13", "second.so");
    int fd = ::open((dir / "first.so").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    auto first = SharedLibrary::load_fd(fd, "first.so");
    ASSERT_TRUE(first) << first.error().message;
    int second_fd = ::open((dir / "second.so").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(second_fd, 0);
    ASSERT_EQ(::dup2(second_fd, fd), fd) << "the first library's name now means the second file";
    ::close(second_fd);
    auto second = SharedLibrary::load_fd(fd, "second.so");
    ASSERT_TRUE(second) << second.error().message;
    auto version = [](const SharedLibrary &l) {
        return std::string(static_cast<const ferry_plugin_v1_t *>(l.symbol(FERRY_PLUGIN_SYMBOL_V1))->version);
    };
    EXPECT_EQ(version(*first), "cuda12");
    EXPECT_EQ(version(*second), "cuda13");
    ::close(fd);
}

// The same, as it happens: the build's plugins discovered again and again in one process, with
// descriptor numbers shifting in between. efa.so is NODELETE, so its /proc/self/fd name stays
// taken, and without the comparison another plugin got efa.so in its place.
TEST_F(PluginTrust, DiscoveringTheBuildsPluginsAgainInOneProcessFindsTheSame) {
    auto states = [] {
        LoaderOptions o;
        o.search_path = {FERRY_BUILD_PLUGIN_DIR};
        std::string out;
        for (const auto &p : load_plugins(o).plugins) out += cat(p.path, " ", state(p), " ", p.version, "\n");
        return out;
    };
    const std::string first = states();
    std::vector<int> held;
    for (int i = 0; i < 30; ++i) {
        if (i % 3 != 2) {
            held.push_back(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        } else if (!held.empty()) {
            size_t k = size_t(i) % held.size();
            ::close(held[k]);
            held.erase(held.begin() + ptrdiff_t(k));
        }
        ASSERT_EQ(states(), first) << "discovery " << i;
    }
    for (int fd : held) ::close(fd);
}

// strict: everything root's, no sticky directory (above); here, for a process that is not root,
// its own files: owner loads them, strict does not. ferry-info runs as the second user.
TEST_F(PluginTrust, StrictRefusesAnEnginesOwnFilesThatOwnerAccepts) {
    REQUIRE_OTHER_USER();
    const auto &other = other_user();
    fs::path base = scratch_dir();
    fs::path mine = base / "mine";
    test::copy_file(fake("fake_good"), mine / "fake_good.so");
    set_mode(mine / "fake_good.so", 0644);
    // As root, strict loads root's plugin outside sticky directories, where the build tree allows.
    auto as_root = load_one(mine, "fake_good", TrustLevel::Strict);
    if (as_root.state != PluginState::Loaded) {
        printf("SKIPPED: the build tree itself fails plugin_trust=strict: %s\n", state(as_root).c_str());
        fs::remove_all(base);
        GTEST_SKIP() << state(as_root);
    }

    set_mode(base, 0755);
    set_mode(lib.path(), 0755);
    test::copy_file(FERRY_LIBFERRY_SO, lib / "libferry.so.0");
    set_mode(lib / "libferry.so.0", 0755);
    give_to(mine, other.uid(), other.gid());
    give_to(mine / "fake_good.so", other.uid(), other.gid());
    auto as_other = [&](const std::string &level) {
        int status = -1;
        std::string out = test::run_command(
            cat("env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH=", lib.path().string(), " FERRY_PLUGIN_PATH=", mine.string(),
                " setpriv --reuid=", other.uid(), " --regid=", other.gid(), " --clear-groups ", FERRY_INFO_BIN,
                " --plugin-trust ", level, " 2>&1"),
            &status);
        return out;
    };
    std::string owner = as_other("owner");
    if (has(owner, "setpriv: not found") || has(owner, "setpriv: command not found")) {
        printf("SKIPPED: setpriv (util-linux) is not installed: cannot run ferry-info as another user\n");
        fs::remove_all(base);
        GTEST_SKIP();
    }
    EXPECT_TRUE(has(owner, "fake_good  [loaded]  " + (mine / "fake_good.so").string())) << owner;
    std::string strict = as_other("strict");
    const std::string f = (mine / "fake_good.so").string();
    EXPECT_TRUE(has(strict, cat("fake_good  [untrusted]  ", f, "\n      skipped: ", mine.string(), " is owned by uid ",
                                other.uid(), ", not root (plugin_trust=strict); ", f, " is owned by uid ", other.uid(),
                                ", not root (plugin_trust=strict); fix: chown root ", mine.string(), " and chown root ",
                                f, ", or set plugin_trust=owner or any to load it")))
        << strict;
    fs::remove_all(base);
}

// Where Python's wheel and the NIXL drop-in directory keep their transports: <dir of the
// library holding Ferry's core>/ferry/plugins. It is checked like every directory on the path.
TEST_F(PluginTrust, TheDirectoryBesideTheLibraryIsCheckedToo) {
    test::copy_file(FERRY_LIBFERRY_SO, lib / "libferry.so.0");
    fs::path f = lib / "ferry/plugins/fake_good.so";
    test::copy_file(fake("fake_good"), f);
    set_mode(lib / "ferry/plugins", 0777);
    int status = -1;
    std::string text = ferry_info("", "", &status);
    EXPECT_TRUE(has(text, "fake_good  [untrusted]  " + f.string())) << text;
    EXPECT_TRUE(has(text, (lib / "ferry/plugins").string() + " is writable by others (mode 0777)")) << text;
    set_mode(lib / "ferry/plugins", 0755);
    text = ferry_info("", "", &status);
    EXPECT_TRUE(has(text, "fake_good  [loaded]  " + f.string())) << text;
}

TEST_F(PluginTrust, TheLevelComesFromTheOptionThenTheEnvironment) {
    EXPECT_EQ(*resolve_plugin_trust(nullptr), TrustLevel::Owner) << "the default";
    setenv("FERRY_PLUGIN_TRUST", "strict", 1);
    EXPECT_EQ(*resolve_plugin_trust(nullptr), TrustLevel::Strict);
    std::string any = "any";
    EXPECT_EQ(*resolve_plugin_trust(&any), TrustLevel::Any) << "the option beats the environment";
    setenv("FERRY_PLUGIN_TRUST", "lax", 1);
    auto bad = resolve_plugin_trust(nullptr);
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().message, "environment FERRY_PLUGIN_TRUST = 'lax'; use strict, owner (the default) or any");
    unsetenv("FERRY_PLUGIN_TRUST");
    int status = -1;
    std::string out = ferry_info("FERRY_PLUGIN_PATH=" + dir.path().string() + " FERRY_PLUGIN_TRUST=lax", "", &status);
    EXPECT_EQ(status, 1) << out;
    EXPECT_TRUE(has(out, "environment FERRY_PLUGIN_TRUST = 'lax'")) << out;
    auto e = Engine::create({{"plugin_trust", "lax"}});
    ASSERT_FALSE(e);
    EXPECT_EQ(e.error().code, -EINVAL);
    EXPECT_TRUE(has(e.error().message, "config key 'plugin_trust' = 'lax'; use strict, owner (the default) or any"))
        << e.error().message;
}

// The engine: an untrusted transport is left out, said once in its log, and named in the error
// when nothing else loads; plugin_trust=any loads it.
TEST_F(PluginTrust, AnEngineSkipsUntrustedTransportsAndLogsEachOnce) {
    fs::path f = dir / "example.so";
    test::copy_file(std::string(FERRY_EXAMPLE_PLUGIN_DIR) + "/example.so", f);
    set_mode(f, 0666);
    const Config config{{"plugin_path", dir.path().string()}, {"plugins", ""}};
    test::StderrCapture log;
    auto refused = Engine::create(config);
    auto again = Engine::create(config);
    std::string said = log.take();
    ASSERT_FALSE(refused);
    EXPECT_EQ(refused.error().code, -ENOENT);
    EXPECT_TRUE(has(refused.error().message, f.string() + " was skipped: " + f.string() +
                                                 " is writable by others (mode 0666); fix: chmod go-w " + f.string()))
        << refused.error().message;
    EXPECT_EQ(test::count_of(said, "plugin " + f.string() + " skipped: "), 1u) << said;

    auto requested = Engine::create({{"plugin_path", dir.path().string()}, {"plugins", "example"}});
    ASSERT_FALSE(requested);
    EXPECT_TRUE(has(requested.error().message, "plugin 'example' (" + f.string() + ") was requested but is untrusted"))
        << requested.error().message;

    test::StderrCapture log_any;
    Config any = config;
    any["plugin_trust"] = "any";
    auto loaded = Engine::create(any);
    ASSERT_TRUE(loaded) << loaded.error().message;
    ASSERT_EQ((*loaded)->transports().size(), 1u);
    EXPECT_EQ((*loaded)->transports()[0].name, "example");
    EXPECT_EQ(test::count_of(log_any.take(), "plugin " + f.string() + " loaded despite: "), 1u);
}
