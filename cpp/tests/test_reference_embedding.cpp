// embedding.hpp against cpp/reference/embedding.hpp: lookup and the gradient's scatter-add with
// repeated ids, on odd sizes.
#include <cstdint>
#include <random>
#include <vector>

#include "attnx/embedding.hpp"
#include "reference/embedding.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

void test_embedding(size_t N, size_t vocab, size_t D, unsigned seed) {
    std::mt19937 rng(seed);
    const auto table = random_values(rng, vocab * D), dout = random_values(rng, N * D), dtable0 = random_values(rng, vocab * D);
    std::vector<int64_t> ids(N);
    for (auto& id : ids) id = (int64_t)(rng() % vocab);  // N > vocab: ids repeat
    std::vector<double> out(N * D), dtable = dtable0;
    reference::embedding_forward(out.data(), ids.data(), table.data(), N, D);
    reference::embedding_backward(dtable.data(), dout.data(), ids.data(), N, D);
    char where[64];
    std::snprintf(where, sizeof where, "embedding N=%zu vocab=%zu D=%zu", N, vocab, D);
    check_every_level(where, {{"out", out}, {"dtable", dtable}}, [&](auto tag) {
        using T = decltype(tag);
        const auto table_ = cast<T>(table), dout_ = cast<T>(dout);
        std::vector<T> out_(N * D), dtable_ = cast<T>(dtable0);
        embedding_forward<T>(out_.data(), ids.data(), table_.data(), N, D);
        embedding_backward<T>(dtable_.data(), dout_.data(), ids.data(), N, D);
        return Named{{"out", to_double(out_)}, {"dtable", to_double(dtable_)}};
    });
}

}  // namespace

int main() {
    test_embedding(1, 3, 1, 1);
    test_embedding(37, 11, 13, 2);
    test_embedding(1000, 97, 33, 3);
    return attnx::test::report("test_reference_embedding");
}
