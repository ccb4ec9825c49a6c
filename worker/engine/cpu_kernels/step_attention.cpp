// A decode step's attention for one layer in one call: the fused QKV product's queries and keys
// rotated (layers.cpp's ``rotary``), the new key and value written into each row's slot at its
// length, and the rows attended over their slots (attention.cpp's ``decode_attention``). The same
// kernels as the layer's ops run one by one from Python, so the same results bit for bit; what
// goes is the Python between them (views, the attention interface's checks, two advanced-index
// writes): about 100 us a layer on this 2-core EPYC, 3 ms of a 30-layer step.

#include "kernels.h"

#include <cstring>

at::Tensor append_and_attend(
    const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& key_cache,
    const at::Tensor& value_cache, const at::Tensor& positions, const at::Tensor& mask, int64_t heads,
    double scale) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(1) == 1 && qkv.stride(2) == 1, "qkv: [rows, 1, width], rows contiguous");
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes(), "caches: [slots, kv_heads, columns, dim]");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(), "contiguous caches");
  TORCH_CHECK(key_cache.scalar_type() == qkv.scalar_type() && value_cache.scalar_type() == qkv.scalar_type(), "one dtype");
  const int64_t rows = qkv.size(0), kv_heads = key_cache.size(1), columns = key_cache.size(2), dim = key_cache.size(3);
  TORCH_CHECK(heads > 0 && qkv.size(2) == (heads + 2 * kv_heads) * dim, "qkv: heads + 2 kv_heads of head_dim");
  TORCH_CHECK(rows <= key_cache.size(0), "a slot per row");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.dim() == 1 && positions.size(0) == rows &&
              positions.is_contiguous(), "positions: [rows] int64");
  TORCH_CHECK(mask.dim() == 4 && mask.size(0) == rows, "mask: [rows, 1, 1, width]");
  const int64_t width = mask.size(3);
  TORCH_CHECK(width <= columns, "the mask is wider than the slots");
  const int64_t* position = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(position[r] >= 0 && position[r] < width, "a row's position past the columns attended");
  }
  auto heads_of = [&](int64_t first, int64_t count) {  // [rows, count, 1, dim], as the model's view
    return qkv.narrow(2, first * dim, count * dim).view({rows, 1, count, dim}).transpose(1, 2);
  };
  const std::vector<at::Tensor> rotated = rotary(heads_of(0, heads), heads_of(heads, kv_heads), cos, sin);
  const at::Tensor new_values = heads_of(heads + kv_heads, kv_heads);
  // Each row's key (rotated, contiguous) and value (the product's columns) into its slot.
  const int64_t size = qkv.element_size(), bytes = dim * size;
  const char* keys_in = static_cast<const char*>(rotated[1].data_ptr());
  const char* values_in = static_cast<const char*>(new_values.data_ptr());
  char* keys_out = static_cast<char*>(key_cache.data_ptr());
  char* values_out = static_cast<char*>(value_cache.data_ptr());
  const int64_t slot = key_cache.stride(0) * size, head = key_cache.stride(1) * size, column = dim * size;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t at_ = r * slot + h * head + position[r] * column;
      std::memcpy(keys_out + at_, keys_in + (r * kv_heads + h) * bytes, bytes);
      std::memcpy(values_out + at_, values_in + r * new_values.stride(0) * size + h * bytes, bytes);
    }
  }
  const at::Tensor keys = key_cache.narrow(0, 0, rows).narrow(2, 0, width);
  const at::Tensor values = value_cache.narrow(0, 0, rows).narrow(2, 0, width);
  return decode_attention(rotated[0], keys, values, mask, scale).view({rows, 1, heads * dim});
}
