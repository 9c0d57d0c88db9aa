// Plugin files that are broken the ways files get broken: cut short by an interrupted copy,
// built for another architecture, class or byte order, or not a shared object at all. The
// loader records a reason that says what is wrong with the file, loads the other plugins, and
// nothing crashes (the dynamic loader itself dies of SIGBUS on a truncated shared object, so
// this also runs ferry-info, a separate process, over the same directory). tests/loader_test.cpp
// covers empty files, non-ELF garbage and ABI mismatches.
#include <gtest/gtest.h>

#include <elf.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "loader/plugin_loader.hpp"
#include "test_util.hpp"

using namespace ferry;
using ferry::test::TempDir;

namespace {

std::vector<char> read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_file(const std::filesystem::path &path, const std::vector<char> &bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Broken {
    std::string name;
    std::vector<char> bytes;
    std::string expect;  // in the reason
};

std::vector<Broken> broken_copies_of(const std::vector<char> &good) {
    auto patched = [&](size_t off, std::vector<char> with) {
        auto b = good;
        std::copy(with.begin(), with.end(), b.begin() + static_cast<ptrdiff_t>(off));
        return b;
    };
    auto cut = [&](size_t n) { return std::vector<char>(good.begin(), good.begin() + static_cast<ptrdiff_t>(n)); };
    uint16_t aarch64 = EM_AARCH64, rel = ET_REL;
    return {
        {"cut_half", cut(good.size() / 2), "truncated"},
        {"cut_header", cut(64), "truncated"},
        {"cut_one_byte", cut(good.size() - 1), "truncated"},
        {"cut_ident", cut(10), "truncated"},
        {"for_aarch64", patched(offsetof(Elf64_Ehdr, e_machine), {char(aarch64 & 0xff), char(aarch64 >> 8)}),
         "built for aarch64, this host runs x86_64"},
        {"for_32bit", patched(EI_CLASS, {char(ELFCLASS32)}), "32-bit"},
        {"for_big_endian", patched(EI_DATA, {char(ELFDATA2MSB)}), "byte order"},
        {"object_file", patched(offsetof(Elf64_Ehdr, e_type), {char(rel & 0xff), char(rel >> 8)}),
         "not a shared object"},
        {"script", std::vector<char>{'#', '!', '/', 'b', 'i', 'n', '/', 's', 'h', '\n'}, "invalid ELF header"},
    };
}

const PluginRecord *find(const PluginReport &r, const std::string &name) {
    for (auto &p : r.plugins)
        if (p.name == name) return &p;
    return nullptr;
}

}  // namespace

TEST(PluginFiles, BrokenFilesAreRecordedWithTheirReasonAndTheOthersLoad) {
#if !defined(__x86_64__)
    GTEST_SKIP() << "the crafted foreign-architecture case assumes an x86_64 host";
#endif
    TempDir dir;
    auto good = read_file(std::string(FERRY_FAKE_PLUGIN_DIR) + "/fake_good.so");
    ASSERT_GT(good.size(), 1024u);
    test::copy_file(std::string(FERRY_FAKE_PLUGIN_DIR) + "/fake_good.so", dir / "fake_good.so");
    auto cases = broken_copies_of(good);
    for (auto &c : cases) write_file(dir / (c.name + ".so"), c.bytes);

    LoaderOptions o;
    o.search_path = {dir.path()};
    auto report = load_plugins(o);
    for (auto &c : cases) {
        SCOPED_TRACE(c.name);
        auto *p = find(report, c.name);
        ASSERT_NE(p, nullptr) << report.to_text();
        EXPECT_EQ(p->state, PluginState::Failed);
        EXPECT_NE(p->reason.find(c.expect), std::string::npos) << p->reason;
        EXPECT_NE(p->reason.find(c.name + ".so"), std::string::npos) << "the reason names the file: " << p->reason;
        std::cout << c.name << ": " << p->reason << "\n";
    }
    auto *ok = find(report, "fake_good");
    ASSERT_NE(ok, nullptr);
    EXPECT_EQ(ok->state, PluginState::Loaded) << ok->reason;
    EXPECT_TRUE(report.errors.empty()) << "nobody asked for the broken ones by name";

    // Asked for by name, a broken plugin is an error that carries the same reason.
    o.selection = PluginSelection::parse("fake_good,cut_half");
    auto strict = load_plugins(o);
    ASSERT_FALSE(strict.errors.empty());
    EXPECT_NE(strict.to_text().find("truncated"), std::string::npos) << strict.to_text();

    // ferry-info in its own process: exits normally (no signal) and names each file's problem.
    int status = 0;
    std::string out =
        test::run_command("FERRY_PLUGIN_PATH=" + dir.path().string() + " " + FERRY_INFO_BIN + " 2>&1", &status);
    EXPECT_GE(status, 0) << "ferry-info died of a signal:\n" << out;
    for (auto &c : cases) EXPECT_NE(out.find(c.name), std::string::npos) << out;
    EXPECT_NE(out.find("truncated"), std::string::npos) << out;
}
