// The kernels' entry points, as bindings.cpp exposes them to Python.
#pragma once

#include <torch/extension.h>

#include <optional>
#include <vector>

// attention.cpp
at::Tensor decode_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& mask, double scale);
at::Tensor prefill_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const std::optional<at::Tensor>& mask,
    double scale, bool dots);
bool prefill_supported();

// layers.cpp
std::vector<at::Tensor> rms_norm(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& weight, double eps);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
std::vector<at::Tensor> rotary(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& cos, const at::Tensor& sin);

// step_attention.cpp
at::Tensor append_and_attend(
    const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& key_cache,
    const at::Tensor& value_cache, const at::Tensor& positions, const at::Tensor& mask, int64_t heads,
    double scale);
