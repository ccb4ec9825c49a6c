// Fused CPU attention for the batched engine (see __init__.py for why and how it is built).
//
// decode_attention: one query token per row against that row's own cached columns. Each
// (row, key/value head) task reads only the columns up to the row's last attended one, so a
// batch of mixed lengths pays for each row's own length, not the longest; scores, softmax and
// the weighted values stay in registers and one small fp32 buffer, in one pass over the keys
// and one over the values.
#include "kernels.h"
#include "vectors.h"

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

using tokenferry::fVec;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxGroups = 16;

using tokenferry::load_floats;

template <typename T>
inline void store_floats(T* dest, const float* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dest[i] = static_cast<T>(src[i]);
}

#ifdef CPU_CAPABILITY_AVX512
// Lane k of the result: ``v[k]``'s 16 lanes combined by ``combine`` (an add or a max), in four
// transposing levels instead of 16 horizontal reductions (a third of the score pass's
// instructions at head_dim 64).
template <typename Combine>
inline __m512 across16(const __m512* v, Combine combine) {
  __m512 t[8];
  for (int i = 0; i < 8; ++i) {
    t[i] = combine(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {
    u[i] = combine(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
  }
  const __m512 w0 = combine(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 w1 = combine(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return combine(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
}

inline __m512 sum16(const __m512* v) {
  return across16(v, [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); });
}

inline __m512 max16(const __m512* v) {
  return across16(v, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });
}

// The weighted values of ``G`` grouped query heads, column by column: each value vector is
// loaded once and meets every group's weight, so G * DC accumulators are in flight at once (one
// group's 16-column chain at a time left the multiply-adds waiting on each other's latency).
// ``DC`` vectors of 16 dims per pass over the columns keep the accumulators within the registers.
// Each accumulator still adds its columns in order, so the result is the same to the bit.
template <typename T, int DV, int G>
void accumulate_values(
    const float* scores, int64_t padded, const T* v, int64_t v_col, int64_t span, float (*accs)[kMaxHeadDim]) {
  constexpr int DC = G * DV <= 24 ? DV : (G * 4 <= 24 && DV % 4 == 0 ? 4 : (G * 2 <= 24 ? 2 : 1));
  for (int d0 = 0; d0 < DV; d0 += DC) {
    __m512 acc[G][DC];
    for (int g = 0; g < G; ++g)
      for (int d = 0; d < DC; ++d) acc[g][d] = _mm512_setzero_ps();
    for (int64_t j = 0; j < span; ++j) {
      const T* vc = v + j * v_col + 16 * d0;
      __m512 values[DC];
      for (int d = 0; d < DC; ++d) values[d] = __m512(load_floats(vc + 16 * d));
      for (int g = 0; g < G; ++g) {
        const __m512 w = _mm512_set1_ps(scores[g * padded + j]);
        for (int d = 0; d < DC; ++d) acc[g][d] = _mm512_fmadd_ps(w, values[d], acc[g][d]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int d = 0; d < DC; ++d) _mm512_store_ps(accs[g] + 16 * (d0 + d), acc[g][d]);
  }
}

template <typename T, int DV>
bool accumulate_values_grouped(
    int64_t groups, const float* scores, int64_t padded, const T* v, int64_t v_col, int64_t span,
    float (*accs)[kMaxHeadDim]) {
  switch (groups) {
    case 1: accumulate_values<T, DV, 1>(scores, padded, v, v_col, span, accs); return true;
    case 2: accumulate_values<T, DV, 2>(scores, padded, v, v_col, span, accs); return true;
    case 3: accumulate_values<T, DV, 3>(scores, padded, v, v_col, span, accs); return true;
    case 4: accumulate_values<T, DV, 4>(scores, padded, v, v_col, span, accs); return true;
    case 5: accumulate_values<T, DV, 5>(scores, padded, v, v_col, span, accs); return true;
    case 6: accumulate_values<T, DV, 6>(scores, padded, v, v_col, span, accs); return true;
    case 7: accumulate_values<T, DV, 7>(scores, padded, v, v_col, span, accs); return true;
    case 8: accumulate_values<T, DV, 8>(scores, padded, v, v_col, span, accs); return true;
    default: return false;
  }
}

// One row and key/value head, head_dim = 16 * DV, in blocks of 16 columns. Keys of other types
// are widened to fp32 once per block into a small buffer; fp32 keys are read where they lie.
// Every grouped query head then reads them from L1 with its accumulators in registers.
template <typename T, int DV>
void decode_task_avx512(
    const float (*q)[kMaxHeadDim], int64_t groups, const T* k, int64_t k_col, const T* v, int64_t v_col,
    const bool* m, int64_t m_col, int64_t span, float* scores, T* o) {
  constexpr int D = 16 * DV;
  constexpr bool kDirect = std::is_same_v<T, float>;
  alignas(64) float block[kDirect ? 1 : 16][D];
  alignas(64) static const float zeros[D] = {};
  const float* columns[16];
  const int64_t padded = (span + 15) / 16 * 16;
  __m512 maxima[kMaxGroups];
  for (int64_t g = 0; g < groups; ++g) maxima[g] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j0 = 0; j0 < padded; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, span - j0);
    __mmask16 keep = 0;
    for (int64_t c = 0; c < n; ++c) {
      if (m[(j0 + c) * m_col]) keep |= static_cast<__mmask16>(1u << c);
      const T* kc = k + (j0 + c) * k_col;
      if constexpr (kDirect) {
        columns[c] = kc;
      } else {
        for (int d = 0; d < D; d += 16) load_floats(kc + d).store(block[c] + d);
        columns[c] = block[c];
      }
    }
    for (int64_t c = n; c < 16; ++c) columns[c] = zeros;
    for (int64_t g = 0; g < groups; ++g) {
      __m512 qv[DV];
      for (int d = 0; d < DV; ++d) qv[d] = _mm512_load_ps(q[g] + 16 * d);
      __m512 partial[16];
      for (int c = 0; c < 16; ++c) {
        __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(columns[c]));
        for (int d = 1; d < DV; ++d) acc = _mm512_fmadd_ps(qv[d], _mm512_loadu_ps(columns[c] + 16 * d), acc);
        partial[c] = acc;
      }
      const __m512 s = _mm512_mask_blend_ps(keep, minus_inf, sum16(partial));
      _mm512_storeu_ps(scores + g * padded + j0, s);
      maxima[g] = _mm512_max_ps(maxima[g], s);
    }
  }
  float totals[kMaxGroups];
  for (int64_t g = 0; g < groups; ++g) {
    float* s = scores + g * padded;
    const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(maxima[g]));
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < padded; j += 16) {
      const __m512 e = __m512((fVec(_mm512_sub_ps(_mm512_loadu_ps(s + j), top))).exp_u20());
      _mm512_storeu_ps(s + j, e);
      total = _mm512_add_ps(total, e);
    }
    totals[g] = _mm512_reduce_add_ps(total);
  }
  alignas(64) float accs[kMaxGroups][kMaxHeadDim];
  if (!accumulate_values_grouped<T, DV>(groups, scores, padded, v, v_col, span, accs)) {
    alignas(64) float vblock[16][D];
    for (int64_t g = 0; g < groups; ++g) std::fill(accs[g], accs[g] + D, 0.0f);
    for (int64_t j0 = 0; j0 < span; j0 += 16) {
      const int64_t n = std::min<int64_t>(16, span - j0);
      for (int64_t c = 0; c < n; ++c) {
        const T* vc = v + (j0 + c) * v_col;
        for (int d = 0; d < D; d += 16) load_floats(vc + d).store(vblock[c] + d);
      }
      for (int64_t g = 0; g < groups; ++g) {
        const float* w = scores + g * padded + j0;
        __m512 acc[DV];
        for (int d = 0; d < DV; ++d) acc[d] = _mm512_load_ps(accs[g] + 16 * d);
        for (int64_t c = 0; c < n; ++c) {
          const __m512 wc = _mm512_set1_ps(w[c]);
          for (int d = 0; d < DV; ++d) acc[d] = _mm512_fmadd_ps(wc, _mm512_load_ps(vblock[c] + 16 * d), acc[d]);
        }
        for (int d = 0; d < DV; ++d) _mm512_store_ps(accs[g] + 16 * d, acc[d]);
      }
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    const float inverse = 1.0f / totals[g];
    for (int d = 0; d < D; ++d) accs[g][d] *= inverse;
    store_floats(o + g * D, accs[g], D);
  }
}
#endif

#ifdef TOKENFERRY_AVX512_BF16
// bf16 rows on cores with AVX512_BF16: keys and values stay bf16 and meet the query (scores) and
// the weights (values) in dot products of pairs (vdpbf16ps), fp32 accumulation, as oneDNN's bf16
// products do. No widening pass, half the multiply instructions of the fp32 path above.
template <int DV>
void decode_task_bf16(
    const at::BFloat16* q, int64_t q_head, int64_t groups, float scale, const at::BFloat16* k, int64_t k_col,
    const at::BFloat16* v, int64_t v_col, const bool* m, int64_t m_col, int64_t span, float* scores,
    at::BFloat16* o) {
  constexpr int D = 16 * DV;
  constexpr int W = DV / 2;  // 512-bit registers of 32 bf16 per row
  const int64_t padded = (span + 15) / 16 * 16;
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 scale_v = _mm512_set1_ps(scale);
  // Block by block, every group in turn: a block's 16 keys are read from memory once and stay
  // in L1 for the other groups (a whole row's keys per group came from L2 again for each group).
  __m512 tops[kMaxGroups];
  for (int64_t g = 0; g < groups; ++g) tops[g] = minus_inf;
  for (int64_t j0 = 0; j0 < padded; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, span - j0);
    __mmask16 keep = 0;
    for (int c = 0; c < n; ++c)
      if (m[(j0 + c) * m_col]) keep |= static_cast<__mmask16>(1u << c);
    for (int64_t g = 0; g < groups; ++g) {
      __m512i qv[W];
      for (int w = 0; w < W; ++w) qv[w] = _mm512_loadu_si512(q + g * q_head + 32 * w);
      __m512 partial[16];
      for (int c = 0; c < 16; ++c) {
        __m512 acc = _mm512_setzero_ps();
        if (c < n) {
          const at::BFloat16* kc = k + (j0 + c) * k_col;
          for (int w = 0; w < W; ++w) acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(kc + 32 * w), (__m512bh)qv[w]);
        }
        partial[c] = acc;
      }
      const __m512 sv = _mm512_mask_blend_ps(keep, minus_inf, _mm512_mul_ps(sum16(partial), scale_v));
      _mm512_storeu_ps(scores + g * padded + j0, sv);
      tops[g] = _mm512_max_ps(tops[g], sv);
    }
  }
  float maxima[kMaxGroups];
  for (int64_t g = 0; g < groups; ++g) maxima[g] = _mm512_reduce_max_ps(tops[g]);
  float totals[kMaxGroups];
  for (int64_t g = 0; g < groups; ++g) {
    float* sg = scores + g * padded;
    const __m512 top = _mm512_set1_ps(maxima[g]);
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < padded; j += 16) {
      const __m512 e = __m512(fVec(_mm512_sub_ps(_mm512_loadu_ps(sg + j), top)).exp_u20());
      _mm512_storeu_ps(sg + j, e);
      total = _mm512_add_ps(total, e);
    }
    totals[g] = _mm512_reduce_add_ps(total);
  }
  // Values in column pairs: the two rows' bf16 interleaved (unpack lo/hi), each group's pair of
  // weights broadcast as one 32-bit lane. Accumulator lanes hold d in the unpack's order, put
  // back in place at the end.
  __m512 acc[kMaxGroups][2 * W];
  for (int64_t g = 0; g < groups; ++g)
    for (int w = 0; w < 2 * W; ++w) acc[g][w] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t j = 0; j < span; j += 2) {
    const bool pair = j + 1 < span;
    const at::BFloat16* v0 = v + j * v_col;
    const at::BFloat16* v1 = v + (j + 1) * v_col;
    __m512i lo[W], hi[W];
    for (int w = 0; w < W; ++w) {
      const __m512i a = _mm512_loadu_si512(v0 + 32 * w);
      const __m512i b = pair ? _mm512_loadu_si512(v1 + 32 * w) : zero;
      lo[w] = _mm512_unpacklo_epi16(a, b);
      hi[w] = _mm512_unpackhi_epi16(a, b);
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float* sg = scores + g * padded;
      const uint32_t w0 = c10::bit_cast<uint16_t>(at::BFloat16(sg[j]));
      const uint32_t w1 = pair ? c10::bit_cast<uint16_t>(at::BFloat16(sg[j + 1])) : 0u;
      const __m512bh weights = (__m512bh)_mm512_set1_epi32(static_cast<int>(w0 | (w1 << 16)));
      for (int w = 0; w < W; ++w) {
        acc[g][2 * w] = _mm512_dpbf16_ps(acc[g][2 * w], (__m512bh)lo[w], weights);
        acc[g][2 * w + 1] = _mm512_dpbf16_ps(acc[g][2 * w + 1], (__m512bh)hi[w], weights);
      }
    }
  }
  for (int64_t g = 0; g < groups; ++g) {
    const float inverse = 1.0f / totals[g];
    alignas(64) float lanes[2 * W][16];
    for (int w = 0; w < 2 * W; ++w) _mm512_store_ps(lanes[w], _mm512_mul_ps(acc[g][w], _mm512_set1_ps(inverse)));
    at::BFloat16* og = o + g * D;
    // Register 2w (lo) lane 4L+i holds d = 32w + 8L + i, register 2w+1 (hi) holds d = 32w + 8L + 4 + i.
    for (int w = 0; w < W; ++w)
      for (int L = 0; L < 4; ++L)
        for (int i = 0; i < 4; ++i) {
          og[32 * w + 8 * L + i] = at::BFloat16(lanes[2 * w][4 * L + i]);
          og[32 * w + 8 * L + 4 + i] = at::BFloat16(lanes[2 * w + 1][4 * L + i]);
        }
  }
}
#endif

// One past the last attended key in mask[0, end) (0 if none), and the first at or after
// ``begin``: 64 keys a step where the mask is contiguous, as transformers' masks are. A 512-query
// chunk over 1,500 keys scanned byte by byte cost about 0.3 ms a layer.
inline int64_t attended_end(const bool* mask, int64_t end, int64_t stride) {
#ifdef CPU_CAPABILITY_AVX512
  if (stride == 1) {
    while (end >= 64) {
      const uint64_t bits = _mm512_test_epi8_mask(
          _mm512_loadu_si512(mask + end - 64), _mm512_loadu_si512(mask + end - 64));
      if (bits != 0) return end - 64 + (63 - __builtin_clzll(bits)) + 1;
      end -= 64;
    }
  }
#endif
  while (end > 0 && !mask[(end - 1) * stride]) --end;
  return end;
}

inline int64_t attended_begin(const bool* mask, int64_t begin, int64_t end, int64_t stride) {
#ifdef CPU_CAPABILITY_AVX512
  if (stride == 1) {
    while (begin + 64 <= end) {
      const uint64_t bits = _mm512_test_epi8_mask(_mm512_loadu_si512(mask + begin), _mm512_loadu_si512(mask + begin));
      if (bits != 0) return begin + __builtin_ctzll(bits);
      begin += 64;
    }
  }
#endif
  while (begin < end && !mask[begin * stride]) ++begin;
  return begin;
}

template <typename T>
void decode_kernel(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& mask, double scale, at::Tensor& out) {
  const int64_t rows = query.size(0);
  const int64_t heads = query.size(1);
  const int64_t head_dim = query.size(3);
  const int64_t kv_heads = key.size(1);
  const int64_t columns = key.size(2);
  const int64_t groups = heads / kv_heads;
  constexpr int64_t lanes = fVec::size();
  const int64_t vec_dim = head_dim - head_dim % lanes;

  const T* q_base = query.data_ptr<T>();
  const T* k_base = key.data_ptr<T>();
  const T* v_base = value.data_ptr<T>();
  const bool* m_base = mask.data_ptr<bool>();
  T* o_base = out.data_ptr<T>();
  const int64_t q_row = query.stride(0), q_head = query.stride(1);
  const int64_t k_row = key.stride(0), k_head = key.stride(1), k_col = key.stride(2);
  const int64_t v_row = value.stride(0), v_head = value.stride(1), v_col = value.stride(2);
  const int64_t m_row = mask.stride(0), m_col = mask.stride(3);

  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    alignas(64) float q[kMaxGroups][kMaxHeadDim];
    alignas(64) float acc[kMaxGroups][kMaxHeadDim];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t row = task / kv_heads;
      const int64_t kv = task % kv_heads;
      const bool* m = m_base + row * m_row;
      int64_t span = columns;
      span = attended_end(m, span, m_col);
      T* o = o_base + (row * heads + kv * groups) * head_dim;
      if (span == 0) {  // nothing attended: zeros, as a softmax over nothing has no answer
        for (int64_t i = 0; i < groups * head_dim; ++i) o[i] = static_cast<T>(0.0f);
        continue;
      }
      for (int64_t g = 0; g < groups; ++g) {
        const T* qs = q_base + row * q_row + (kv * groups + g) * q_head;
        for (int64_t d = 0; d < head_dim; ++d) q[g][d] = static_cast<float>(qs[d]) * static_cast<float>(scale);
      }
#ifdef TOKENFERRY_AVX512_BF16
      if constexpr (std::is_same_v<T, at::BFloat16>) {
        if (head_dim == 64 || head_dim == 128) {
          scores.resize(static_cast<size_t>(groups * ((span + 15) / 16 * 16)));
          const T* qr = q_base + row * q_row + kv * groups * q_head;
          const T* kr = k_base + row * k_row + kv * k_head;
          const T* vr = v_base + row * v_row + kv * v_head;
          const float sc = static_cast<float>(scale);
          if (head_dim == 64) {
            decode_task_bf16<4>(qr, q_head, groups, sc, kr, k_col, vr, v_col, m, m_col, span, scores.data(), o);
          } else {
            decode_task_bf16<8>(qr, q_head, groups, sc, kr, k_col, vr, v_col, m, m_col, span, scores.data(), o);
          }
          continue;
        }
      }
#endif
#ifdef CPU_CAPABILITY_AVX512
      if (head_dim == 64 || head_dim == 128) {
        scores.resize(static_cast<size_t>(groups * ((span + 15) / 16 * 16)));
        const T* kr = k_base + row * k_row + kv * k_head;
        const T* vr = v_base + row * v_row + kv * v_head;
        if (head_dim == 64) {
          decode_task_avx512<T, 4>(q, groups, kr, k_col, vr, v_col, m, m_col, span, scores.data(), o);
        } else {
          decode_task_avx512<T, 8>(q, groups, kr, k_col, vr, v_col, m, m_col, span, scores.data(), o);
        }
        continue;
      }
#endif
      scores.resize(static_cast<size_t>(groups * span));
      float maxima[kMaxGroups];
      std::fill(maxima, maxima + groups, -std::numeric_limits<float>::infinity());
      const T* k = k_base + row * k_row + kv * k_head;
      for (int64_t j = 0; j < span; ++j) {
        if (!m[j * m_col]) {
          for (int64_t g = 0; g < groups; ++g) scores[g * span + j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        const T* kj = k + j * k_col;
        for (int64_t g = 0; g < groups; ++g) {
          fVec sum(0.0f);
          for (int64_t d = 0; d < vec_dim; d += lanes) sum = at::vec::fmadd(fVec::loadu(q[g] + d), load_floats(kj + d), sum);
          float s = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, sum);
          for (int64_t d = vec_dim; d < head_dim; ++d) s += q[g][d] * static_cast<float>(kj[d]);
          scores[g * span + j] = s;
          maxima[g] = std::max(maxima[g], s);
        }
      }
      float totals[kMaxGroups];
      for (int64_t g = 0; g < groups; ++g) {
        float* s = scores.data() + g * span;
        const fVec top(maxima[g]);
        fVec total(0.0f);
        int64_t j = 0;
        for (; j + lanes <= span; j += lanes) {
          fVec e = (fVec::loadu(s + j) - top).exp_u20();
          e.store(s + j);
          total = total + e;
        }
        float t = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, total);
        for (; j < span; ++j) {
          s[j] = std::exp(s[j] - maxima[g]);
          t += s[j];
        }
        totals[g] = t;
        std::fill(acc[g], acc[g] + head_dim, 0.0f);
      }
      const T* v = v_base + row * v_row + kv * v_head;
      for (int64_t j = 0; j < span; ++j) {
        if (!m[j * m_col]) continue;
        const T* vj = v + j * v_col;
        for (int64_t d = 0; d < vec_dim; d += lanes) {
          const fVec vv = load_floats(vj + d);
          for (int64_t g = 0; g < groups; ++g) {
            at::vec::fmadd(fVec(scores[g * span + j]), vv, fVec::loadu(acc[g] + d)).store(acc[g] + d);
          }
        }
        for (int64_t d = vec_dim; d < head_dim; ++d) {
          const float vd = static_cast<float>(vj[d]);
          for (int64_t g = 0; g < groups; ++g) acc[g][d] += scores[g * span + j] * vd;
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        const float inverse = 1.0f / totals[g];
        for (int64_t d = 0; d < head_dim; ++d) acc[g][d] *= inverse;
        store_floats(o + g * head_dim, acc[g], head_dim);
      }
    }
  });
}

#ifdef CPU_CAPABILITY_AVX512
// Prefill: flash attention over a chunk of queries (see the header). Blocks: 32 queries with
// their grouped heads share one pass over the key/value blocks of 64 they attend; scores and
// the weighted values are register-tiled fp32 FMAs over the blocks widened once to fp32.
constexpr int kQueryBlock = 32;
constexpr int kKeyBlock = 64;
constexpr int kScoreRows = 6;  // register tile of the scores: 6 rows x 64 keys = 24 accumulators

struct PrefillShape {
  int64_t q_len, k_len, heads, kv_heads, groups, head_dim;
};

// Lanes [a, b) of 16 set (none when b <= a).
inline __mmask16 lanes_between(int64_t a, int64_t b) {
  if (b <= a) return 0;
  const uint32_t upto_b = b >= 16 ? 0xFFFFu : ((1u << b) - 1u);
  const uint32_t upto_a = a <= 0 ? 0u : ((1u << a) - 1u);
  return static_cast<__mmask16>(upto_b & ~upto_a);
}

// The 16 mask entries from key ``base`` on as lanes (false past the last key).
inline __mmask16 mask_lanes(const bool* row, int64_t base, int64_t k_len, int64_t m_k) {
  if (m_k == 1 && base + 16 <= k_len) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + base));
    return _mm_test_epi8_mask(bytes, bytes);
  }
  __mmask16 keep = 0;
  for (int lane = 0; lane < 16 && base + lane < k_len; ++lane) {
    keep |= static_cast<__mmask16>(row[(base + lane) * m_k]) << lane;
  }
  return keep;
}

// The fp32 path's keys and values of one key/value head, widened once per call for every query
// block: keys transposed, ``[D][stride]`` (``stride`` >= k_len + kKeyBlock, zeros past k_len, so a
// block starting anywhere reads 64 columns), values ``[k_len + kKeyBlock][D]``. Transposing a
// key block for each query block instead took 13-20 % of the kernel (fp32, 925-1,850 queries).
struct WidenedHead {
  const float* keys_t;
  int64_t stride;
  const float* values;
  // The dots path's keys and values in pairs of bf16 (zeros past k_len): keys ``[D / 2][stride]``,
  // one 32-bit word per key and pair of dims; values per pair of keys, the two rows interleaved
  // by unpack lo/hi (d in the unpack's order, restored at the end), ``[stride / 2][DV]`` vectors.
  const uint32_t* key_pairs;
  const __m512i* value_pairs;
};

template <typename T, int DV, bool kDots>
void prefill_task(
    const PrefillShape& shape, const T* q, int64_t q_pos, int64_t q_head, const T* k, int64_t k_pos,
    const T* v, int64_t v_pos, const bool* mask, int64_t m_q, int64_t m_k, float scale, int64_t q0,
    T* o, int64_t o_pos, const WidenedHead& widened) {
  constexpr int D = 16 * DV;
  constexpr int kValueRows = 24 / DV;
#ifdef TOKENFERRY_AVX512_BF16
  // bf16 on AVX512_BF16 cores, where asked (kDots): products as dot products of bf16 pairs
  // (vdpbf16ps), fp32 sums; the key and value blocks are laid out in pairs (VNNI) instead of widened.
  constexpr bool dots = kDots && std::is_same_v<T, at::BFloat16>;
#else
  constexpr bool dots = false;
#endif  // register tile of the weighted values
  const int64_t groups = shape.groups;
  const int64_t queries = std::min<int64_t>(kQueryBlock, shape.q_len - q0);
  const int64_t rows = queries * groups;  // row r: query q0 + r / groups, head r % groups
  const int64_t padded_rows = (rows + kScoreRows - 1) / kScoreRows * kScoreRows + kValueRows;
  std::vector<float> buffer(static_cast<size_t>(padded_rows * (D + kKeyBlock + D) + 64));
  float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t(63));
  float* qf = base;                              // [padded_rows][D], scaled queries
  float* scores = qf + padded_rows * D;          // [padded_rows][kKeyBlock]
  float* acc = scores + padded_rows * kKeyBlock;  // [padded_rows][D]
  std::fill(qf, qf + padded_rows * D, 0.0f);
  std::fill(acc, acc + padded_rows * D, 0.0f);
  // Per row, in lanes of 16 (``rows`` rounded up): the running maximum and total of its weights.
  alignas(64) float maxima[kQueryBlock * kMaxGroups];
  alignas(64) float totals[kQueryBlock * kMaxGroups];
  std::fill(maxima, maxima + kQueryBlock * kMaxGroups, -std::numeric_limits<float>::infinity());
  std::fill(totals, totals + kQueryBlock * kMaxGroups, 0.0f);
  std::vector<int64_t> lo(static_cast<size_t>(queries)), hi(static_cast<size_t>(queries));
  int64_t first = shape.k_len, last = 0;
  for (int64_t i = 0; i < queries; ++i) {
    const int64_t query = q0 + i;
    if (mask == nullptr) {  // causal, the queries being the last q_len keys
      lo[i] = 0;
      hi[i] = shape.k_len - shape.q_len + query + 1;
    } else {
      const bool* row = mask + query * m_q;
      int64_t a = 0, b = shape.k_len;
      b = attended_end(row, b, m_k);
      a = attended_begin(row, a, b, m_k);
      lo[i] = a;
      hi[i] = b;
    }
    first = std::min(first, lo[i]);
    last = std::max(last, hi[i]);
    for (int64_t g = 0; g < groups; ++g) {
      const T* src = q + query * q_pos + g * q_head;
      float* dst = qf + (i * groups + g) * D;
      for (int d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]) * scale;
    }
  }
  if constexpr (dots) first -= first % 2;  // blocks start on a pair of keys (``value_pairs``)
  std::vector<uint16_t> q16(dots ? static_cast<size_t>(padded_rows * D) : 0);  // the scaled queries in bf16
  std::vector<uint32_t> p16(dots ? static_cast<size_t>(padded_rows * kKeyBlock / 2) : 0);  // weights, in pairs
  if constexpr (dots) {
    for (int64_t i = 0; i < padded_rows * D; ++i) q16[i] = c10::bit_cast<uint16_t>(at::BFloat16(qf[i]));
  }
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j0 = first; j0 < last; j0 += kKeyBlock) {
    const int64_t n = std::min<int64_t>(kKeyBlock, last - j0);
    // fp32 arithmetic: this block's columns of the head's widened keys and values.
    const float* block_keys = widened.keys_t + j0;
    const float* block_values = widened.values + j0 * D;
    // Scores: a 6 x 64 tile per step, the query element broadcast against 64 keys; 6 x 32 where
    // the block has 32 keys or fewer (a causal chunk's last block, every other query block).
    const int vecs = n <= 32 ? 2 : 4;  // vectors of 16 scores per row in this block
    auto score_tiles = [&](auto width) {
    constexpr int NC = decltype(width)::value;
    for (int64_t r0 = 0; r0 < rows; r0 += kScoreRows) {
      __m512 tile[kScoreRows][NC];
      for (int r = 0; r < kScoreRows; ++r)
        for (int c = 0; c < NC; ++c) tile[r][c] = _mm512_setzero_ps();
      if constexpr (dots) {
#ifdef TOKENFERRY_AVX512_BF16
        const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q16.data());
        for (int d2 = 0; d2 < D / 2; ++d2) {
          const uint32_t* kt = widened.key_pairs + d2 * widened.stride + j0;
          __m512bh keys[NC];
          for (int c = 0; c < NC; ++c) keys[c] = (__m512bh)_mm512_loadu_si512(kt + 16 * c);
          for (int r = 0; r < kScoreRows; ++r) {
            const __m512bh qd = (__m512bh)_mm512_set1_epi32(static_cast<int>(q32[((r0 + r) * D) / 2 + d2]));
            for (int c = 0; c < NC; ++c) tile[r][c] = _mm512_dpbf16_ps(tile[r][c], qd, keys[c]);
          }
        }
#endif
      } else {
        for (int d = 0; d < D; ++d) {
          const float* kt = block_keys + d * widened.stride;
          __m512 keys[NC];
          for (int c = 0; c < NC; ++c) keys[c] = _mm512_loadu_ps(kt + 16 * c);
          for (int r = 0; r < kScoreRows; ++r) {
            const __m512 qd = _mm512_set1_ps(qf[(r0 + r) * D + d]);
            for (int c = 0; c < NC; ++c) tile[r][c] = _mm512_fmadd_ps(qd, keys[c], tile[r][c]);
          }
        }
      }
      for (int r = 0; r < kScoreRows; ++r)
        for (int c = 0; c < NC; ++c) _mm512_store_ps(scores + (r0 + r) * kKeyBlock + 16 * c, tile[r][c]);
    }
    };
    if (vecs == 2) {
      score_tiles(std::integral_constant<int, 2>{});
    } else {
      score_tiles(std::integral_constant<int, 4>{});
    }
    // Masks and the online softmax, 16 rows at a time: each row's maximum and sum come out of
    // transposing reductions (``across16``) into one lane each, and the rows' maxima, rescales
    // and totals are updated as vectors. Row by row, with two horizontal reductions and a scalar
    // exp per row, the kernel took 1.07-1.11x as long (A/B, fp32 and bf16). Each row's running
    // output is rescaled below.
    alignas(64) float rescale[kQueryBlock * kMaxGroups];
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      const int64_t count = std::min<int64_t>(16, rows - r0);
      __m512 lanes[16];
      for (int64_t k = 0; k < 16; ++k) {
        lanes[k] = minus_inf;
        if (k >= count) continue;
        const int64_t r = r0 + k, i = r / groups;
        float* s = scores + r * kKeyBlock;
        const bool* mrow = mask == nullptr ? nullptr : mask + (q0 + i) * m_q;
        for (int c = 0; c < vecs; ++c) {
          const int64_t base = j0 + 16 * c;
          const __mmask16 keep = lanes_between(std::max(lo[i], base) - base, std::min({hi[i], j0 + n, base + 16}) - base) &
              (mrow == nullptr ? __mmask16(0xFFFF) : mask_lanes(mrow, base, shape.k_len, m_k));
          const __m512 sc = _mm512_mask_blend_ps(keep, minus_inf, _mm512_load_ps(s + 16 * c));
          _mm512_store_ps(s + 16 * c, sc);
          lanes[k] = _mm512_max_ps(lanes[k], sc);
        }
      }
      const __m512 before = _mm512_load_ps(maxima + r0);
      const __m512 after = _mm512_max_ps(before, max16(lanes));
      // Rows with nothing attended yet shift by 0 (their scores, all -inf, give 0); rows without
      // an earlier maximum rescale by 0 (their output and total are still 0).
      const __mmask16 attended = _mm512_cmp_ps_mask(after, minus_inf, _CMP_NEQ_OQ);
      const __mmask16 earlier = _mm512_cmp_ps_mask(before, minus_inf, _CMP_NEQ_OQ);
      alignas(64) float shifts[16];
      _mm512_store_ps(shifts, _mm512_maskz_mov_ps(attended, after));
      const __m512 alpha = _mm512_maskz_mov_ps(earlier, __m512(fVec(_mm512_sub_ps(before, after)).exp()));
      for (int64_t k = 0; k < 16; ++k) {
        lanes[k] = _mm512_setzero_ps();
        if (k >= count) continue;
        float* s = scores + (r0 + k) * kKeyBlock;
        const __m512 shift = _mm512_set1_ps(shifts[k]);
        for (int c = 0; c < vecs; ++c) {
          const __m512 e = __m512(fVec(_mm512_sub_ps(_mm512_load_ps(s + 16 * c), shift)).exp_u20());
          _mm512_store_ps(s + 16 * c, e);
          lanes[k] = _mm512_add_ps(lanes[k], e);
        }
        if constexpr (dots) {
#ifdef TOKENFERRY_AVX512_BF16
          // Two vectors of 16 weights to 32 bf16 at a time (round to nearest even, as at::BFloat16).
          __m512i* pr = reinterpret_cast<__m512i*>(p16.data() + (r0 + k) * (kKeyBlock / 2));
          for (int c = 0; c < vecs / 2; ++c) {
            const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_load_ps(s + 32 * c + 16), _mm512_load_ps(s + 32 * c));
            _mm512_storeu_si512(pr + c, (__m512i)pair);
          }
#endif
        }
      }
      _mm512_store_ps(totals + r0, _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(totals + r0), alpha), sum16(lanes)));
      _mm512_store_ps(maxima + r0, after);
      _mm512_store_ps(rescale + r0, alpha);
    }
    // Weighted values: a kValueRows x D tile per step, each weight broadcast against a value row.
    for (int64_t r0 = 0; r0 < rows; r0 += kValueRows) {
      __m512 tile[kValueRows][DV];
      for (int r = 0; r < kValueRows; ++r) {
        const __m512 alpha = _mm512_set1_ps(r0 + r < rows ? rescale[r0 + r] : 0.0f);
        for (int d = 0; d < DV; ++d) tile[r][d] = _mm512_mul_ps(alpha, _mm512_load_ps(acc + (r0 + r) * D + 16 * d));
      }
      if constexpr (dots) {
#ifdef TOKENFERRY_AVX512_BF16
        const __m512i* values_p = widened.value_pairs + (j0 / 2) * DV;
        for (int64_t c2 = 0; c2 < (n + 1) / 2; ++c2) {
          __m512bh vv[DV];
          for (int d = 0; d < DV; ++d) vv[d] = (__m512bh)_mm512_load_si512(values_p + c2 * DV + d);
          for (int r = 0; r < kValueRows; ++r) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32(static_cast<int>(p16[(r0 + r) * (kKeyBlock / 2) + c2]));
            for (int d = 0; d < DV; ++d) tile[r][d] = _mm512_dpbf16_ps(tile[r][d], w, vv[d]);
          }
        }
#endif
      } else {
        for (int64_t c = 0; c < n; ++c) {
          __m512 vv[DV];
          for (int d = 0; d < DV; ++d) vv[d] = _mm512_load_ps(block_values + c * D + 16 * d);
          for (int r = 0; r < kValueRows; ++r) {
            const __m512 w = _mm512_set1_ps(scores[(r0 + r) * kKeyBlock + c]);
            for (int d = 0; d < DV; ++d) tile[r][d] = _mm512_fmadd_ps(w, vv[d], tile[r][d]);
          }
        }
      }
      for (int r = 0; r < kValueRows; ++r)
        for (int d = 0; d < DV; ++d) _mm512_store_ps(acc + (r0 + r) * D + 16 * d, tile[r][d]);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r / groups, g = r % groups;
    const float inverse = totals[r] > 0.0f ? 1.0f / totals[r] : 0.0f;
    float* a = acc + r * D;
    for (int d = 0; d < D; ++d) a[d] *= inverse;
    if constexpr (dots) {  // register 2w lane 4L+i holds d = 32w + 8L + i; register 2w+1, d + 4
      T* out = o + (q0 + i) * o_pos + g * D;
      for (int w = 0; w < DV / 2; ++w)
        for (int L = 0; L < 4; ++L)
          for (int x = 0; x < 4; ++x) {
            out[32 * w + 8 * L + x] = static_cast<T>(a[32 * w + 4 * L + x]);
            out[32 * w + 8 * L + 4 + x] = static_cast<T>(a[32 * w + 16 + 4 * L + x]);
          }
    } else {
      store_floats(o + (q0 + i) * o_pos + g * D, a, D);
    }
  }
}
#endif

}  // namespace

// query [rows, heads, 1, head_dim]; key, value [rows, kv_heads, columns, head_dim] with their
// last dimension contiguous (a slot cache's view); mask bool [rows, 1, 1, columns], true where
// attended. Returns [rows, 1, heads, head_dim], as transformers' sdpa returns its output.
at::Tensor decode_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& mask, double scale) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4 && mask.dim() == 4, "4-d tensors expected");
  TORCH_CHECK(query.size(2) == 1, "one query token per row");
  TORCH_CHECK(query.scalar_type() == key.scalar_type() && key.scalar_type() == value.scalar_type(), "one dtype");
  TORCH_CHECK(mask.scalar_type() == at::kBool, "a boolean mask");
  TORCH_CHECK(query.size(3) <= kMaxHeadDim && key.size(3) == query.size(3) && value.size(3) == query.size(3), "head_dim");
  TORCH_CHECK(query.size(1) % key.size(1) == 0 && query.size(1) / key.size(1) <= kMaxGroups, "query heads per kv head");
  TORCH_CHECK(key.stride(3) == 1 && value.stride(3) == 1, "contiguous head_dim");
  TORCH_CHECK(mask.size(0) == query.size(0) && mask.size(3) == key.size(2), "mask shape");
  const at::Tensor q = query.stride(3) == 1 ? query : query.contiguous();
  at::Tensor out = at::empty({query.size(0), 1, query.size(1), query.size(3)}, query.options());
  switch (query.scalar_type()) {
    case at::kFloat: decode_kernel<float>(q, key, value, mask, scale, out); break;
    case at::kBFloat16: decode_kernel<at::BFloat16>(q, key, value, mask, scale, out); break;
    case at::kHalf: decode_kernel<at::Half>(q, key, value, mask, scale, out); break;
    default: TORCH_CHECK(false, "float32, bfloat16 or float16 expected");
  }
  return out;
}

// query [batch, heads, q_len, head_dim]; key, value [batch, kv_heads, k_len, head_dim] (the last
// dimension contiguous); mask bool [batch, 1, q_len, k_len] (true where attended) or None for
// causal attention with the queries as the last q_len keys. Returns [batch, q_len, heads,
// head_dim], as transformers' sdpa does. head_dim 64 or 128, AVX-512 builds only (prefill_supported).
// ``dots``: bf16 products in bf16 dot products where the build has them (AVX512_BF16), else
// widened to fp32 FMAs; which is faster depends on the cores (``cpu_kernels.choices``).
at::Tensor prefill_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& mask, double scale, bool dots) {
#ifdef CPU_CAPABILITY_AVX512
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "4-d tensors expected");
  TORCH_CHECK(query.scalar_type() == key.scalar_type() && key.scalar_type() == value.scalar_type(), "one dtype");
  const int64_t head_dim = query.size(3);
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "head_dim 64 or 128");
  TORCH_CHECK(key.size(3) == head_dim && value.size(3) == head_dim && key.size(2) == value.size(2), "shapes");
  TORCH_CHECK(query.size(1) % key.size(1) == 0 && query.size(1) / key.size(1) <= kMaxGroups, "query heads per kv head");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1 && value.stride(3) == 1, "contiguous head_dim");
  const PrefillShape shape{query.size(2), key.size(2), query.size(1), key.size(1), query.size(1) / key.size(1), head_dim};
  TORCH_CHECK(shape.k_len >= shape.q_len || mask.has_value(), "causal needs the queries among the keys");
  const int64_t batch = query.size(0);
  if (mask.has_value()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 4, "a boolean mask");
    TORCH_CHECK(mask->size(0) == batch && mask->size(2) == shape.q_len && mask->size(3) == shape.k_len, "mask shape");
  }
  at::Tensor out = at::empty({batch, shape.q_len, shape.heads, head_dim}, query.options());
  const int64_t blocks = (shape.q_len + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = batch * shape.kv_heads * blocks;
  const float fscale = static_cast<float>(scale);
  auto run = [&](auto tag, auto paired) {
    using T = decltype(tag);
    constexpr bool kDots = decltype(paired)::value;
    const T* qb = query.data_ptr<T>();
    const T* kb = key.data_ptr<T>();
    const T* vb = value.data_ptr<T>();
    T* ob = out.data_ptr<T>();
    const bool* mb = mask.has_value() ? mask->data_ptr<bool>() : nullptr;
    // fp32 arithmetic: every head's keys and values widened (keys transposed) once, for all its blocks.
    const int64_t heads = batch * shape.kv_heads;
    const int64_t stride = (shape.k_len + 2 * kKeyBlock - 1) / kKeyBlock * kKeyBlock;
    // The dots path lays each head's keys and values out in pairs once (``WidenedHead``): per
    // query block and key block instead, it was ~7 % of the kernel (bf16, 900 queries).
    const int64_t per_head = kDots ? head_dim * stride : head_dim * stride + (shape.k_len + kKeyBlock) * head_dim;
    // Left uninitialized (each part is written below): zeroing it all was a serial pass.
    std::unique_ptr<float[]> widened_buffer(new float[static_cast<size_t>(heads * per_head + 16)]);
    float* widened_base =
        reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(widened_buffer.get()) + 63) & ~uintptr_t(63));
    {  // each head's keys and values laid out once, in chunks of keys over both threads
      constexpr int64_t kChunk = 256;  // keys per task: a few heads still keep both threads busy
      const int64_t chunks = (shape.k_len + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) num_threads(at::get_num_threads())
      for (int64_t t = 0; t < heads * chunks; ++t) {
        const int64_t h = t / chunks, b = h / shape.kv_heads, kv = h % shape.kv_heads;
        const int64_t c0 = (t % chunks) * kChunk, c1 = std::min(shape.k_len, c0 + kChunk);
        const T* k = kb + b * key.stride(0) + kv * key.stride(1);
        const T* v = vb + b * value.stride(0) + kv * value.stride(1);
        if constexpr (kDots) {
          uint32_t* pairs = reinterpret_cast<uint32_t*>(widened_base + h * per_head);
          __m512i* value_pairs = reinterpret_cast<__m512i*>(pairs + head_dim / 2 * stride);
          const int64_t words = head_dim / 32;  // vectors of 32 bf16 per value row
          for (int64_t c = c0; c < c1; ++c) {
            const uint32_t* kc = reinterpret_cast<const uint32_t*>(k + c * key.stride(2));
            for (int64_t d2 = 0; d2 < head_dim / 2; ++d2) pairs[d2 * stride + c] = kc[d2];
          }
          const __m512i zero = _mm512_setzero_si512();
          for (int64_t c = c0; c < c1; c += 2) {  // c0 is even
            for (int64_t w = 0; w < words; ++w) {
              const __m512i a = _mm512_loadu_si512(v + c * value.stride(2) + 32 * w);
              const __m512i b = c + 1 < c1 ? _mm512_loadu_si512(v + (c + 1) * value.stride(2) + 32 * w) : zero;
              value_pairs[(c / 2) * 2 * words + 2 * w] = _mm512_unpacklo_epi16(a, b);
              value_pairs[(c / 2) * 2 * words + 2 * w + 1] = _mm512_unpackhi_epi16(a, b);
            }
          }
          if (c1 == shape.k_len) {  // the head's last chunk: zeros past its last key
            for (int64_t d2 = 0; d2 < head_dim / 2; ++d2) {
              std::fill(pairs + d2 * stride + shape.k_len, pairs + (d2 + 1) * stride, 0u);
            }
            for (int64_t p = (shape.k_len + 1) / 2; p < stride / 2; ++p) {
              for (int64_t x = 0; x < 2 * words; ++x) value_pairs[p * 2 * words + x] = zero;
            }
          }
        } else {
          float* keys_t = widened_base + h * per_head;
          float* values = keys_t + head_dim * stride;
          for (int64_t c = c0; c < c1; ++c) {
            const T* kc = k + c * key.stride(2);
            const T* vc = v + c * value.stride(2);
            for (int64_t d = 0; d < head_dim; ++d) keys_t[d * stride + c] = static_cast<float>(kc[d]);
            for (int64_t d = 0; d < head_dim; d += 16) load_floats(vc + d).store(values + c * head_dim + d);
          }
          if (c1 == shape.k_len) {  // the head's last chunk: zeros past its last key
            for (int64_t d = 0; d < head_dim; ++d) {
              std::fill(keys_t + d * stride + shape.k_len, keys_t + (d + 1) * stride, 0.0f);
            }
            std::fill(values + shape.k_len * head_dim, values + (shape.k_len + kKeyBlock) * head_dim, 0.0f);
          }
        }
      }
    }
    // Later query blocks attend more keys: tasks are handed out one at a time, heaviest first.
#pragma omp parallel for schedule(dynamic, 1) num_threads(at::get_num_threads())
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t block = blocks - 1 - t % blocks;
      const int64_t kv = (t / blocks) % shape.kv_heads;
      const int64_t b = t / (blocks * shape.kv_heads);
      const T* q = qb + b * query.stride(0) + kv * shape.groups * query.stride(1);
      const T* k = kb + b * key.stride(0) + kv * key.stride(1);
      const T* v = vb + b * value.stride(0) + kv * value.stride(1);
      const bool* m = mb == nullptr ? nullptr : mb + b * mask->stride(0);
      const int64_t m_q = mb == nullptr ? 0 : mask->stride(2), m_k = mb == nullptr ? 0 : mask->stride(3);
      T* o = ob + b * out.stride(0) + kv * shape.groups * head_dim;
      const float* keys_t = widened_base + (b * shape.kv_heads + kv) * per_head;
      const uint32_t* key_pairs = reinterpret_cast<const uint32_t*>(keys_t);
      const WidenedHead widened{
          keys_t, stride, keys_t + head_dim * stride, key_pairs,
          reinterpret_cast<const __m512i*>(key_pairs + head_dim / 2 * stride)};
      if (head_dim == 64) {
        prefill_task<T, 4, kDots>(shape, q, query.stride(2), query.stride(1), k, key.stride(2), v, value.stride(2), m,
                           m_q, m_k, fscale, block * kQueryBlock, o, out.stride(1), widened);
      } else {
        prefill_task<T, 8, kDots>(shape, q, query.stride(2), query.stride(1), k, key.stride(2), v, value.stride(2), m,
                           m_q, m_k, fscale, block * kQueryBlock, o, out.stride(1), widened);
      }
    }
  };
  switch (query.scalar_type()) {
    case at::kFloat: run(float{}, std::false_type{}); break;
    case at::kBFloat16:
      if (dots) {
        run(at::BFloat16{}, std::true_type{});
      } else {
        run(at::BFloat16{}, std::false_type{});
      }
      break;
    case at::kHalf: run(at::Half{}, std::false_type{}); break;
    default: TORCH_CHECK(false, "float32, bfloat16 or float16 expected");
  }
  return out;
#else
  TORCH_CHECK(false, "prefill_attention is built for AVX-512 only");
#endif
}

bool prefill_supported() {
#ifdef CPU_CAPABILITY_AVX512
  return true;
#else
  return false;
#endif
}
