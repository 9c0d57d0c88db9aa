// Checks the std::expected semantics Ferry relies on. In the clang fuzz build this exercises
// compat/expected (the fallback for libraries without std::expected); in the g++ build the
// library's own, so both are held to the same behaviour. Prints what it checked; exits 1 on a
// mismatch.
#include <cstdio>
#include <expected>
#include <memory>
#include <string>
#include <utility>

namespace {

int failures = 0;
int checks = 0;
#define EXPECT(cond)                                                \
    do {                                                            \
        ++checks;                                                   \
        if (!(cond)) {                                              \
            std::printf("FAILED: %s (line %d)\n", #cond, __LINE__); \
            ++failures;                                             \
        }                                                           \
    } while (0)

struct Err {
    int code = 0;
    std::string message;
};
template <class T>
using Res = std::expected<T, Err>;

Res<int> half(int v) {
    if (v % 2) return std::unexpected(Err{-22, "odd"});
    return v / 2;
}
Res<void> check(bool ok) {
    if (!ok) return std::unexpected(Err{-5, "io"});
    return {};
}

}  // namespace

int main() {
#if defined(__cpp_lib_expected)
    std::printf("checking the C++ library's std::expected\n");
#else
    std::printf("checking tests/fuzz/compat/expected (the library has no std::expected)\n");
#endif
    auto a = half(4);
    EXPECT(a.has_value() && bool(a) && *a == 2 && a.value() == 2);
    auto b = half(3);
    EXPECT(!b && b.error().code == -22 && b.error().message == "odd");
    bool threw = false;
    try {
        (void)b.value();
    } catch (const std::bad_expected_access<Err> &e) {
        threw = e.error().code == -22;
    }
    EXPECT(threw);
    EXPECT(check(true).has_value() && !check(false) && check(false).error().code == -5);
    // Move-only values and moves out of an rvalue expected.
    Res<std::unique_ptr<int>> p = std::make_unique<int>(7);
    EXPECT(p && **p == 7);
    std::unique_ptr<int> taken = std::move(p).value();
    EXPECT(taken && *taken == 7);
    // Copies keep value or error; assignment from unexpected switches to the error.
    Res<std::string> s = std::string("x");
    Res<std::string> s2 = s;
    EXPECT(s2 && *s2 == "x" && s->size() == 1);
    s2 = std::unexpected(Err{-1, "gone"});
    EXPECT(!s2 && s2.error().message == "gone");
    s2 = std::string("back");
    EXPECT(s2 && *s2 == "back");
    EXPECT(half(3).value_or(-1) == -1 && half(8).value_or(-1) == 4);
    // Forwarding an error from one Result type to another, as the decoders do.
    auto forward = [](Res<int> r) -> Res<std::string> {
        if (!r) return std::unexpected(r.error());
        return std::to_string(*r);
    };
    EXPECT(forward(half(6)) && *forward(half(6)) == "3" && forward(half(5)).error().code == -22);
    Res<std::string> default_constructed;
    EXPECT(default_constructed.has_value() && default_constructed->empty());
    std::printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
