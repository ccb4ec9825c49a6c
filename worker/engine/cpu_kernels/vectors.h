// Vector helpers both kernel files use (attention.cpp, layers.cpp).
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <type_traits>

namespace tokenferry {

using fVec = at::vec::Vectorized<float>;

// ``fVec::size()`` values of ``data`` (fp32, bf16 or fp16) as fp32 lanes.
template <typename T>
inline fVec load_floats(const T* data) {
  if constexpr (std::is_same_v<T, float>) {
    return fVec::loadu(data);
  } else {
    fVec out;
    at::vec::load_to_float<T>(data, out);
    return out;
  }
}

}  // namespace tokenferry
