// The element counts of one attention call's arrays (attention.hpp's layouts), for the attention tests
#pragma once
#include <cstddef>

#include "attnx/attention.hpp"

namespace attnx::test {

struct AttendSizes {
    size_t query, key, value, context, weights;
    explicit AttendSizes(const AttendShape& sh)
        : query((size_t)sh.B * sh.Tq * sh.H * sh.Dk), key((size_t)sh.B * sh.S * sh.H * sh.Dk),
          value((size_t)sh.B * sh.S * sh.H * sh.Dv), context((size_t)sh.B * sh.Tq * sh.H * sh.Dv),
          weights((size_t)sh.B * sh.H * sh.Tq * sh.S) {}
};

}  // namespace attnx::test
