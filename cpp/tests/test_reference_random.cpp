// random.hpp against cpp/reference/random.hpp: keep masks and uniforms on every SIMD level and
// thread split (odd row lengths leave vector and block tails), the rows of a batch cut into shards
// equal to the whole batch's rows, the drop rate, and keys that differ give different streams.
#include <cstdint>
#include <vector>

#include "attnx/random.hpp"
#include "reference/random.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

void test_keep_and_uniform(size_t rows, size_t cols, uint64_t key, uint64_t first_row, double rate) {
    std::vector<double> keep(rows * cols), u(rows * cols);
    reference::random_keep(keep.data(), rows, cols, key, first_row, rate);
    reference::random_uniform(u.data(), rows, cols, key, first_row);
    char where[96];
    std::snprintf(where, sizeof where, "random rows=%zu cols=%zu rate=%g", rows, cols, rate);
    // a float uniform is the double one rounded down to 24 bits: within 2^-24
    check_every_level(where, {{"keep", keep}, {"uniform", u}}, [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> keep_(rows * cols), u_(rows * cols);
        random_keep<T>(keep_.data(), rows, cols, key, first_row, rate);
        random_uniform<T>(u_.data(), rows, cols, key, first_row);
        return Named{{"keep", to_double(keep_)}, {"uniform", to_double(u_)}};
    }, 1e-7);
}

// The property data-parallel training rests on: rows [0, n) drawn at once equal rows [0, m) and
// [m, n) drawn apart with first_row 0 and m, bit for bit
void test_shards_equal_whole(size_t rows, size_t cols, size_t cut) {
    std::vector<float> whole(rows * cols), parts(rows * cols), uwhole(rows * cols), uparts(rows * cols);
    random_keep<float>(whole.data(), rows, cols, 77, 0, 0.2);
    random_keep<float>(parts.data(), cut, cols, 77, 0, 0.2);
    random_keep<float>(parts.data() + cut * cols, rows - cut, cols, 77, cut, 0.2);
    random_uniform<float>(uwhole.data(), rows, cols, 78, 0);
    random_uniform<float>(uparts.data(), cut, cols, 78, 0);
    random_uniform<float>(uparts.data() + cut * cols, rows - cut, cols, 78, cut);
    CHECK(whole == parts);
    CHECK(uwhole == uparts);
}

void test_rate_and_keys() {
    const size_t n = 200000;
    std::vector<float> keep(n), other(n);
    random_keep<float>(keep.data(), 1, n, 5, 0, 0.3);
    size_t dropped = 0;
    for (float k : keep) {
        dropped += k == 0.0f;
        CHECK(k == 0.0f || std::abs(k - 1.0f / 0.7f) < 1e-6f);
    }
    CHECK_CLOSE(double(dropped) / n, 0.3, 0.01);
    random_keep<float>(other.data(), 1, n, fold_in(5, 1), 0, 0.3);
    size_t same = 0;
    for (size_t i = 0; i < n; ++i) same += keep[i] == other[i];
    CHECK_CLOSE(double(same) / n, 0.3 * 0.3 + 0.7 * 0.7, 0.01);  // independent masks agree by chance only
    std::vector<double> u(n);
    random_uniform<double>(u.data(), 1, n, 9, 0);
    double mean = 0;
    for (double v : u) {
        CHECK(v >= 0.0 && v < 1.0);
        mean += v / n;
    }
    CHECK_CLOSE(mean, 0.5, 0.01);
    std::vector<float> keep0(8);
    random_keep<float>(keep0.data(), 2, 4, 3, 0, 0.0);
    for (float k : keep0) CHECK(k == 1.0f);  // rate 0 keeps everything
    CHECK(fold_in(1, 2) != fold_in(2, 1) && fold_in(1, 2) != fold_in(1, 3));
}

}  // namespace

int main() {
    test_keep_and_uniform(1, 1, 1, 0, 0.5);
    test_keep_and_uniform(3, 7, 2, 5, 0.2);
    test_keep_and_uniform(5, 1031, 3, 0, 0.1);       // several word blocks per row
    test_keep_and_uniform(1201, 133, 4, 17, 0.25);   // splits across two threads
    test_shards_equal_whole(10, 13, 3);
    test_shards_equal_whole(7, 1100, 6);
    test_rate_and_keys();
    return attnx::test::report("test_reference_random");
}
