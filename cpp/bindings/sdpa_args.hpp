// The scaled dot-product core's arguments as its bindings read them (sdpa_forward, sdpa_backward in
// bind_attention.cpp; the int8 core, sdpa_forward_int8, in bind_quantized.cpp).
#pragma once
#include <string>

#include "attnx/attention.hpp"
#include "checks.hpp"

namespace attnx::bind {

// The kernels' view of a mask parsed by parse_mask (checks.hpp), with the causal limit.
inline AttendMask attend_mask(const MaskRows& rows, bool causal) {
    AttendMask out;
    out.data = rows.data;
    out.stride_b = rows.stride_b;
    out.stride_t = rows.stride_t;
    out.causal = causal;
    return out;
}

// Sizes of the (B, T, H * D) operands of the scaled dot-product core.
struct SdpaDims {
    py::ssize_t B, H, Tq, S, Dk, Dv;
    AttendShape shape() const { return {(int)B, (int)H, (int)Tq, (int)S, (int)Dk, (int)Dv}; }
};

inline SdpaDims sdpa_dims(const py::array& q, const py::array& k, const py::array& v, int heads, const char* fn) {
    const std::string f(fn);
    if (heads < 1) throw py::value_error(f + ": heads must be positive, got " + std::to_string(heads));
    check_rank(q, 3, (f + ": query").c_str());
    check_rank(k, 3, (f + ": key").c_str());
    check_rank(v, 3, (f + ": value").c_str());
    const py::ssize_t B = q.shape(0), Tq = q.shape(1), S = k.shape(1);
    check_shape(k, {B, -1, q.shape(2)}, (f + ": key (batch and size must match the query's)").c_str());
    check_shape(v, {B, S, -1}, (f + ": value (batch and length must match the key's)").c_str());
    if (q.shape(2) % heads || v.shape(2) % heads)
        throw py::value_error(f + ": query size " + std::to_string(q.shape(2)) + " and value size " +
                              std::to_string(v.shape(2)) + " must be divisible by heads=" + std::to_string(heads));
    return {B, heads, Tq, S, q.shape(2) / heads, v.shape(2) / heads};
}

}  // namespace attnx::bind
