// The decoder layer's elementwise work fused: RMSNorm in one pass per row (the residual added
// in the same pass where asked), the gated MLP's silu(gate) * up in one pass over the fused
// gate/up product, and the rotary embedding of queries and keys in one call. torch runs each
// as 2-14 ops, each a pass over memory and a dispatch.
//
// Rounding follows transformers' modules: a half-precision RMSNorm rounds the normalized row to
// the model's dtype before the weight multiplies it (LlamaRMSNorm), and silu(gate) is rounded
// before it multiplies up, as torch's two ops do. silu is torch's own (at::vec's exp, the
// expression of torch's CPU kernel), a norm's sum of squares adds in torch's order, and the
// rotation rounds each product and the sum as transformers' three ops: all give torch's results
// bit for bit (tested against transformers' modules). Built with -ffp-contract=off for that.

#include "kernels.h"
#include "vectors.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using tokenferry::fVec;

template <typename T>
inline float to_float(T value) {
  return static_cast<float>(value);
}

template <typename T>
inline T round_to(float value) {
  return static_cast<T>(value);
}

// ``count`` values of ``src`` widened to fp32 into ``dst``.
template <typename T>
inline void widen(const T* src, float* dst, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(src, src + count, dst);
  } else {
    int64_t i = 0;
    for (; i + fVec::size() <= count; i += fVec::size()) {
      at::vec::convert(src + i, dst + i, fVec::size());
    }
    for (; i < count; ++i) dst[i] = to_float(src[i]);
  }
}

// ``count`` fp32 values rounded to T (round to nearest even, as torch's casts).
template <typename T>
inline void narrow(const float* src, T* dst, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    std::copy(src, src + count, dst);
  } else {
    at::vec::convert(src, dst, count);
  }
}

int64_t ceil_log2(int64_t value) {
  if (value <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t rest = static_cast<uint64_t>(value - 1); rest != 0; rest >>= 1) ++bits;
  return bits;
}

// Sums ``load(i * 4 + k)`` for i < count into four chains k, in levels: each 2^power terms of a
// chain are summed apart, then added to the level above, so only sums of similar size meet.
template <typename T, typename Load>
std::array<T, 4> chained_sum(const Load& load, int64_t count) {
  constexpr int64_t kLevels = 4;
  const int64_t power = std::max<int64_t>(4, ceil_log2(count) / kLevels);
  const int64_t step = int64_t(1) << power;
  const int64_t mask = step - 1;
  std::array<std::array<T, 4>, kLevels> levels;
  for (auto& level : levels) level.fill(T(0.0f));
  int64_t i = 0;
  while (i + step <= count) {
    for (int64_t j = 0; j < step; ++j, ++i) {
      for (int64_t k = 0; k < 4; ++k) levels[0][k] = levels[0][k] + load(i * 4 + k);
    }
    for (int64_t level = 1; level < kLevels; ++level) {
      for (int64_t k = 0; k < 4; ++k) {
        levels[level][k] = levels[level][k] + levels[level - 1][k];
        levels[level - 1][k] = T(0.0f);
      }
      if ((i & (mask << (level * power))) != 0) break;
    }
  }
  for (; i < count; ++i) {
    for (int64_t k = 0; k < 4; ++k) levels[0][k] = levels[0][k] + load(i * 4 + k);
  }
  for (int64_t level = 1; level < kLevels; ++level) {
    for (int64_t k = 0; k < 4; ++k) levels[0][k] = levels[0][k] + levels[level][k];
  }
  return levels[0];
}

// One chain's sum of ``count`` terms: four chains over the first count / 4 * 4, the rest into
// the first, then the chains added in order.
template <typename T, typename Load>
T row_sum(const Load& load, int64_t count) {
  std::array<T, 4> chains = chained_sum<T>(load, count / 4);
  for (int64_t i = count / 4 * 4; i < count; ++i) chains[0] = chains[0] + load(i);
  for (int64_t k = 1; k < 4; ++k) chains[0] = chains[0] + chains[k];
  return chains[0];
}

// Eight fp32 lanes: the vector torch's CPU sum adds in. Its sum kernel has no AVX-512 build, so
// even on AVX-512 machines it runs the AVX2 one, 8 lanes wide; plain per-lane adds give the same
// bits as its vector adds.
struct Lanes8 {
  std::array<float, 8> lane;
  Lanes8() = default;
  explicit Lanes8(float value) { lane.fill(value); }
  Lanes8 operator+(const Lanes8& other) const {
    Lanes8 sum(0.0f);
    for (int i = 0; i < 8; ++i) sum.lane[i] = lane[i] + other.lane[i];
    return sum;
  }
};

// The sum of squares of a row, added in the order torch's CPU sum adds a contiguous row (8-lane
// vectors in four chained sums, then the scalar tail, then the lanes in order). RMSNorm's
// statistics then come out bit for bit as transformers' ``pow(2).mean(-1)`` computes them, so
// a model's outputs do not change when its norms run here.
float sum_of_squares(const float* row, int64_t width) {
  constexpr int64_t lanes = 8;
  if (width < lanes) {
    return row_sum<float>([row](int64_t i) { return row[i] * row[i]; }, width);
  }
  const int64_t vectors = width / lanes;
  const Lanes8 sums = row_sum<Lanes8>(
      [row](int64_t v) {
        Lanes8 squares(0.0f);
        for (int64_t i = 0; i < lanes; ++i) squares.lane[i] = row[v * lanes + i] * row[v * lanes + i];
        return squares;
      },
      vectors);
  float total = 0.0f;
  for (int64_t i = vectors * lanes; i < width; ++i) total += row[i] * row[i];
  for (int64_t lane = 0; lane < lanes; ++lane) total += sums.lane[lane];
  return total;
}

// One row: ``out = weight * dtype(x * rsqrt(mean(x^2) + eps))``; with ``residual``, x is first
// ``dtype(x + residual)``, also written to ``sum``.
// ``row`` and ``buffer`` are fp32 scratch of ``width`` each.
template <typename T>
void norm_row(
    const T* x, const T* residual, const T* weight, float eps, int64_t width, T* out, T* sum, float* row,
    float* buffer) {
  widen(x, row, width);
  if (residual != nullptr) {
    widen(residual, buffer, width);
    int64_t i = 0;
    for (; i + fVec::size() <= width; i += fVec::size()) {
      (fVec::loadu(row + i) + fVec::loadu(buffer + i)).store(row + i);
    }
    for (; i < width; ++i) row[i] += buffer[i];
    narrow(row, sum, width);
    widen(sum, row, width);  // the sum as the model's dtype holds it
  }
  const float total = sum_of_squares(row, width);
  const float scale = 1.0f / std::sqrt(total / static_cast<float>(width) + eps);
  const fVec scales(scale);
  int64_t i = 0;
  for (; i + fVec::size() <= width; i += fVec::size()) (fVec::loadu(row + i) * scales).store(row + i);
  for (; i < width; ++i) row[i] *= scale;
  if constexpr (!std::is_same_v<T, float>) {
    narrow(row, out, width);  // rounded as the module's ``.to(input_dtype)``
    widen(out, row, width);
  }
  widen(weight, buffer, width);
  i = 0;
  for (; i + fVec::size() <= width; i += fVec::size()) {
    (fVec::loadu(row + i) * fVec::loadu(buffer + i)).store(row + i);
  }
  for (; i < width; ++i) row[i] *= buffer[i];
  narrow(row, out, width);
}

void check_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.device().is_cpu(), name, " must be on CPU");
  TORCH_CHECK(x.dim() >= 1 && x.stride(-1) == 1, name, " must have contiguous rows");
}

}  // namespace

// RMSNorm of each row of ``x`` (``[..., width]``); with ``residual``, of ``x + residual``, returned too.
std::vector<at::Tensor> rms_norm(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  const int64_t width = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == width && weight.is_contiguous(), "weight must be [width]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight and x must share a dtype");
  const torch::Tensor rows = x.reshape({-1, width});
  torch::Tensor residual_rows;
  if (residual.has_value()) {
    check_rows(*residual, "residual");
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(), "residual must match x");
    residual_rows = residual->reshape({-1, width});
  }
  auto out = torch::empty(x.sizes(), x.options());
  auto sum = residual.has_value() ? torch::empty(x.sizes(), x.options()) : torch::Tensor();
  const int64_t count = rows.size(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    const scalar_t* w = weight.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    scalar_t* s = residual.has_value() ? sum.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, count, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(width), buffer(width);
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* res = residual.has_value() ? residual_rows.data_ptr<scalar_t>() + r * residual_rows.stride(0) : nullptr;
        norm_row<scalar_t>(
            rows.data_ptr<scalar_t>() + r * rows.stride(0), res, w, static_cast<float>(eps), width,
            o + r * width, s == nullptr ? nullptr : s + r * width, row.data(), buffer.data());
      }
    });
  });
  if (residual.has_value()) return {out, sum};
  return {out};
}

// ``silu(gate) * up`` of a fused gate/up product ``[..., 2 * width]`` (gate first): ``[..., width]``.
at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(-1) % 2 == 0, "gate_up must have an even width");
  const int64_t width = gate_up.size(-1) / 2;
  const torch::Tensor rows = gate_up.reshape({-1, 2 * width});
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() = width;
  auto out = torch::empty(shape, gate_up.options());
  const int64_t count = rows.size(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_and_mul", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1));
    at::parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> gate_buffer(width), up_buffer(width);
      float* gate = gate_buffer.data();
      float* up = up_buffer.data();
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* g = rows.data_ptr<scalar_t>() + r * rows.stride(0);
        widen(g, gate, width);
        widen(g + width, up, width);
        const fVec one(1.0f);
        int64_t i = 0;
        // torch's silu kernel: x / (1 + exp(-x)), in fp32.
        for (; i + fVec::size() <= width; i += fVec::size()) {
          const fVec x = fVec::loadu(gate + i);
          (x / (one + x.neg().exp())).store(gate + i);
        }
        for (; i < width; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i]));
        scalar_t* row_out = o + r * width;
        if constexpr (!std::is_same_v<scalar_t, float>) {
          narrow(gate, row_out, width);  // silu's output, in the model's dtype
          widen(row_out, gate, width);
        }
        i = 0;
        for (; i + fVec::size() <= width; i += fVec::size()) {
          (fVec::loadu(gate + i) * fVec::loadu(up + i)).store(gate + i);
        }
        for (; i < width; ++i) gate[i] *= up[i];
        narrow(gate, row_out, width);
      }
    });
  });
  return out;
}

namespace {

using tokenferry::load_floats;

// ``value`` rounded to T and widened back: what a torch op of dtype T hands the next one.
template <typename T>
inline fVec rounded(const fVec& value) {
  if constexpr (std::is_same_v<T, float>) {
    return value;
  } else {
    return std::get<0>(at::vec::convert_to_float<T>(at::vec::convert_from_float<T>(value, value)));
  }
}

template <typename T>
inline void store_narrow(const fVec& value, T* dest) {
  if constexpr (std::is_same_v<T, float>) {
    value.store(dest);
  } else {
    at::vec::convert_from_float<T>(value, value).store(dest, fVec::size());
  }
}

// One head's vector of ``dim`` values rotated as transformers' ``apply_rotary_pos_emb``:
// ``x * cos + rotate_half(x) * sin``, each product and the sum rounded to T as torch's three ops
// round them (``-x2 * s`` is ``(-x2) * s`` exactly). A lane per value: the scalar loop over
// widened copies it replaced took 1.18 ms for a 1,500-token fp32 layer, six times a copy of it.
template <typename T>
void rotate_vector(const T* x, const T* cos, const T* sin, int64_t dim, T* out) {
  const int64_t half = dim / 2;
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float> || at::vec::is_reduced_floating_point_v<T>) {  // not double
    for (; i + fVec::size() <= half; i += fVec::size()) {
      const fVec first = load_floats(x + i), second = load_floats(x + half + i);
      const fVec direct_first = rounded<T>(first * load_floats(cos + i));
      const fVec direct_second = rounded<T>(second * load_floats(cos + half + i));
      const fVec rotated_first = rounded<T>(second.neg() * load_floats(sin + i));
      const fVec rotated_second = rounded<T>(first * load_floats(sin + half + i));
      store_narrow(direct_first + rotated_first, out + i);
      store_narrow(direct_second + rotated_second, out + half + i);
    }
  }
  for (; i < half; ++i) {  // what the lanes leave: half a head dim past a multiple of 16, or double
    const float first = to_float(x[i]), second = to_float(x[i + half]);
    const float direct_first = to_float(round_to<T>(first * to_float(cos[i])));
    const float direct_second = to_float(round_to<T>(second * to_float(cos[i + half])));
    const float rotated_first = to_float(round_to<T>(-second * to_float(sin[i])));
    const float rotated_second = to_float(round_to<T>(first * to_float(sin[i + half])));
    out[i] = round_to<T>(direct_first + rotated_first);
    out[i + half] = round_to<T>(direct_second + rotated_second);
  }
}

// ``x`` ``[batch, heads, seq, dim]`` (last dim contiguous) rotated by ``cos``/``sin``
// ``[batch, seq, dim]``: a new contiguous tensor.
at::Tensor rotate_heads(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t batch = x.size(0), heads = x.size(1), seq = x.size(2), dim = x.size(3);
  auto out = torch::empty({batch, heads, seq, dim}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rotate_heads", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* cp = cos.data_ptr<scalar_t>();
    const scalar_t* sp = sin.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 4096 / dim);
    at::parallel_for(0, batch * heads * seq, grain, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / (heads * seq), h = (task / seq) % heads, s = task % seq;
        rotate_vector<scalar_t>(
            xp + b * x.stride(0) + h * x.stride(1) + s * x.stride(2), cp + b * cos.stride(0) + s * cos.stride(1),
            sp + b * sin.stride(0) + s * sin.stride(1), dim, op + task * dim);
      }
    });
  });
  return out;
}

void check_rotary(const at::Tensor& x, const at::Tensor& cos) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 4 && x.stride(3) == 1, "heads must be [batch, heads, seq, dim] rows");
  TORCH_CHECK(x.size(3) % 2 == 0, "an even head dim");
  TORCH_CHECK(cos.dim() == 3 && cos.size(0) == x.size(0) && cos.size(1) == x.size(2) && cos.size(2) == x.size(3),
              "cos and sin must be [batch, seq, dim]");
  TORCH_CHECK(cos.stride(2) == 1 && cos.scalar_type() == x.scalar_type(), "cos and sin: contiguous rows, x's dtype");
}

}  // namespace

// Queries and keys rotated by the rotary embedding, as transformers' ``apply_rotary_pos_emb``
// computes them bit for bit (``cos``/``sin`` ``[batch, seq, dim]``, unsqueezed at dim 1 there).
std::vector<at::Tensor> rotary(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin) {
  check_rotary(query, cos);
  check_rotary(key, cos);
  TORCH_CHECK(sin.sizes() == cos.sizes() && sin.strides() == cos.strides() && sin.scalar_type() == cos.scalar_type(),
              "sin must be shaped as cos");
  return {rotate_heads(query, cos, sin), rotate_heads(key, cos, sin)};
}
